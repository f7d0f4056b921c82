"""Batches from uint8 image tensors: held on the training device when they fit, else streamed.

A resident loader keeps the whole split as one uint8 tensor on the device and draws every batch
with device-side indexing, so an epoch costs no host work. A streamed loader (datasets larger than
device memory, e.g. memory-mapped mammograms) gathers each batch on the host, pins it and copies it
asynchronously. Both normalise and augment on the device, a whole batch at a time.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from src.data.augment import augment as augment_batch


def fits_on_device(nbytes: int, device: torch.device, fraction: float = 0.5) -> bool:
    """True when ``nbytes`` take at most ``fraction`` of the device's free memory."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return nbytes <= fraction * free
    return True  # CPU tensors are already in host memory (or memory-mapped)


class Loader:
    """Iterate over (images float, labels) batches of one split.

    Args:
        x: uint8 images (N, C, H, W); may be memory-mapped.
        y: int64 labels (N,).
        mean, std: per-channel normalisation in [0, 1] units.
        augment: one of ``src.data.augment.AUGMENTS`` (training only).
        shuffle, drop_last: as in ``torch.utils.data.DataLoader``.
        sample_weights: optional per-image weights: each epoch draws N images with replacement.
        channels_last: return batches in channels_last memory format.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, device: torch.device,
                 mean: Sequence[float], std: Sequence[float], augment: str = "none", shuffle: bool = False,
                 drop_last: bool = False, seed: int = 0, sample_weights: torch.Tensor | None = None,
                 channels_last: bool = False, resident: bool | None = None):
        self.device, self.batch_size, self.augment = device, batch_size, augment
        self.shuffle, self.drop_last, self.channels_last = shuffle, drop_last, channels_last
        self.n = len(y)
        if resident is None:
            resident = fits_on_device(x.numel(), device)
        self.resident = resident
        self.x = x.to(device) if resident else x
        self.y = y.to(device)
        self.mean = torch.tensor(mean, device=device).view(1, -1, 1, 1) * 255.0
        self.inv_std = 1.0 / (torch.tensor(std, device=device).view(1, -1, 1, 1) * 255.0)
        self.weights = sample_weights.to(device) if sample_weights is not None else None
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(seed)
        self._epoch_start: torch.Tensor | None = None  # generator state when the current pass began
        self._batch = 0  # batches handed out in the current pass
        self._skip = 0  # batches to redraw silently at the start of the next pass (a mid-epoch resume)

    def __len__(self) -> int:
        return self.n // self.batch_size if self.drop_last else -(-self.n // self.batch_size)

    def _order(self) -> torch.Tensor:
        if self.weights is not None:
            return torch.multinomial(self.weights, self.n, replacement=True, generator=self.gen)
        if self.shuffle:
            return torch.randperm(self.n, device=self.device, generator=self.gen)
        return torch.arange(self.n, device=self.device)

    def _gather(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 images and labels of ``idx``: device indexing when resident, else a sorted host read
        (kinder to memory-mapped files) copied asynchronously from pinned memory."""
        if self.resident:
            return self.x[idx], self.y[idx]
        host_idx, _ = idx.cpu().sort()
        batch = self.x[host_idx]
        if self.device.type == "cuda":
            batch = batch.pin_memory().to(self.device, non_blocking=True)
        return batch, self.y[host_idx.to(self.device)]

    def state_dict(self) -> dict[str, torch.Tensor | int]:
        """Where the batch stream stands: the generator state at the start of the current pass and the
        batches handed out since (``batch`` 0 between passes). Restoring it redraws the pass's order and
        augmentations exactly and resumes after ``batch`` batches."""
        if self._epoch_start is None:
            return {"gen": self.gen.get_state(), "batch": 0}
        return {"gen": self._epoch_start, "batch": self._batch}

    @property
    def pass_complete(self) -> bool:
        """Whether the current pass has handed out its last batch (its caller may have stopped before asking for
        more, which would end the pass)."""
        return self._epoch_start is not None and self._batch >= len(self)

    def end_pass(self) -> None:
        """End a pass whose last batch was handed out: the generator already stands where the pass leaves it, so the
        state is the one between passes."""
        assert self.pass_complete, "end_pass: the pass has batches left"
        self._epoch_start = None

    def load_state_dict(self, state: dict) -> None:
        self.gen.set_state(state["gen"])
        self._skip, self._epoch_start, self._batch = int(state["batch"]), None, 0

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        skip, self._skip = self._skip, 0
        self._epoch_start, self._batch = self.gen.get_state(), 0
        order = self._order()
        for i in range(len(self)):
            xb, yb = self._gather(order[i * self.batch_size:(i + 1) * self.batch_size])
            xb = xb.float()
            if self.augment != "none":  # on raw pixel values, so padding and shifts fill with black (0)
                xb = augment_batch(xb, self.augment, self.gen)
            self._batch = i + 1
            if i < skip:  # drawn again only to advance the generator as the interrupted pass did
                continue
            xb = (xb - self.mean) * self.inv_std
            if self.channels_last:
                xb = xb.contiguous(memory_format=torch.channels_last)
            yield xb, yb
        self._epoch_start = None
