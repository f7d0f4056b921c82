"""Memory-lean CPU training paths for the transformer block (``model.lean``, on by default).

Custom autograd functions that save fewer activations than autograd through the plain ops, with the same
outputs and gradients: attention without copies of q and k, GELU-dropout-fc2 and LayerNorm-linear
recomputed in backward (33% fewer saved activations for the default CIFAR-10 ViT, measured at equal
speed). :class:`LeanBlock` is :class:`~src.models.layers.Block` with the same parameters; it takes these
paths only for eager CPU training and runs the plain block otherwise (CUDA, ``torch.compile``, the
stacked members' ``torch.func`` transforms, evaluation, attention maps).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from src.models.layers import Block, dropout_keep, eager_cpu, keep_scaled, sdpa


def _linear_backward(grad: torch.Tensor, inp: torch.Tensor, weight: torch.Tensor, has_bias: bool):
    """Gradients of ``F.linear(inp, weight, bias)``: (input, weight, bias or None), the last two in the
    weight's dtype (under autocast ``grad`` and ``inp`` may be bf16)."""
    g2 = grad.reshape(-1, grad.shape[-1])
    grad_w = (g2.t() @ inp.reshape(-1, inp.shape[-1]).to(g2.dtype)).to(weight.dtype)
    grad_b = g2.sum(0).to(weight.dtype) if has_bias else None
    return grad @ weight.to(grad.dtype), grad_w, grad_b


class _DropAttention(torch.autograd.Function):
    """dropout(softmax(q k^T / sqrt(d))) @ v from the fused QKV output (B, T, 3 * dim), returning (B, heads, T,
    head_dim). It saves q, k, v (one head-major copy of the QKV output, which is then freed), the probabilities
    and the boolean keep-mask (none at p = 0); the dropped probabilities are recomputed in backward.

    Autograd through the explicit ops also keeps contiguous copies of q and k and the dropped probabilities: for
    the default CIFAR-10 ViT at batch 128 that is 33 MiB more per block. The batched products take contiguous
    (B * heads, T, head_dim) operands: on q, k and v as views of the QKV output (strided by head) every product
    copied its operand first, six copies of q, k or v a block's step, and the gradient of the QKV output was
    assembled by two more; here one copy each way (the profile in docs/benchmarks/README.md).
    """

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx, qkv: torch.Tensor, heads: int, p: float) -> torch.Tensor:
        B, T, three_dim = qkv.shape
        qkvh = qkv.view(B, T, 3, heads, three_dim // (3 * heads)).permute(2, 0, 3, 1, 4).contiguous()
        q, k, v = qkvh.unbind(0)  # each (B, heads, T, head_dim), contiguous
        scale, inv_keep = q.shape[-1] ** -0.5, 1.0 / (1.0 - p)
        # softmax accumulates in fp32 for bf16 input on its own: no fp32 copy of the (B, heads, T, T) scores
        probs = (q @ k.transpose(-2, -1)).mul_(scale).softmax(dim=-1)
        keep = dropout_keep(probs, p) if p > 0 else None  # p = 0: no mask, no draw
        out = (keep_scaled(probs, keep, inv_keep) if keep is not None else probs) @ v
        ctx.save_for_backward(qkvh, probs, keep)
        ctx.scale, ctx.inv_keep = scale, inv_keep
        return out

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad: torch.Tensor):
        qkvh, probs, keep = ctx.saved_tensors
        q, k, v = qkvh.unbind(0)
        _, B, H, T, d = qkvh.shape
        grad = grad.contiguous()  # merge_heads' gradient arrives token-major
        grads = torch.empty_like(qkvh)  # (3, B, heads, T, head_dim): each product writes its slice in place
        dropped = keep_scaled(probs, keep, ctx.inv_keep) if keep is not None else probs

        def bmm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
            return torch.bmm(a.flatten(0, 1), b.flatten(0, 1), out=None if out is None else out.view(B * H, T, -1))

        bmm(dropped.transpose(-2, -1), grad, out=grads[2])
        del dropped
        grad_p = bmm(grad, v.transpose(-2, -1)).view(B, H, T, T)
        if keep is not None:
            grad_p = keep_scaled(grad_p, keep, ctx.inv_keep)
        grad_s = grad_p.sub_((grad_p * probs).sum(dim=-1, keepdim=True)).mul_(probs).mul_(ctx.scale)  # softmax bwd
        bmm(grad_s, k, out=grads[0])
        bmm(grad_s.transpose(-2, -1), q, out=grads[1])
        return grads.permute(1, 3, 0, 2, 4).reshape(B, T, 3 * H * d), None, None


class _GeluDropLinear(torch.autograd.Function):
    """linear(dropout(gelu(a))) that saves ``a`` and the keep-mask, not the dropped activations: the
    MLP's hidden layer is the widest tensor of a block, and recomputing GELU in backward is cheap."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx, a: torch.Tensor, keep: torch.Tensor, inv_keep: float, weight: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
        h = keep_scaled(F.gelu(a), keep, inv_keep)
        ctx.save_for_backward(a, keep, weight)
        ctx.inv_keep, ctx.has_bias = inv_keep, bias is not None
        return F.linear(h, weight.to(h.dtype), None if bias is None else bias.to(h.dtype))

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad: torch.Tensor):
        a, keep, weight = ctx.saved_tensors
        h = keep_scaled(F.gelu(a), keep, ctx.inv_keep)
        grad_h, grad_w, grad_b = _linear_backward(grad, h, weight, ctx.has_bias)
        grad_h = keep_scaled(grad_h, keep, ctx.inv_keep)
        return torch.ops.aten.gelu_backward(grad_h, a), None, None, grad_w, grad_b


class _LayerNormLinear(torch.autograd.Function):
    """linear(layer_norm(x)) that saves ``x`` and the normalisation statistics, not the normalised
    activations (recomputed in backward): a pre-norm block's LayerNorm already keeps ``x``, so this
    drops one (B, T, dim) tensor per norm from the saved activations."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx, x: torch.Tensor, ln_weight: torch.Tensor, ln_bias: torch.Tensor, eps: float,
                weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        y, mean, rstd = torch.native_layer_norm(x, (x.shape[-1],), ln_weight, ln_bias, eps)
        ctx.save_for_backward(x, mean, rstd, ln_weight, ln_bias, weight)
        ctx.has_bias = bias is not None
        return F.linear(y, weight, bias)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad: torch.Tensor):
        x, mean, rstd, ln_weight, ln_bias, weight = ctx.saved_tensors
        y = (x - mean).mul_(rstd).mul_(ln_weight).add_(ln_bias)
        grad_y, grad_w, grad_b = _linear_backward(grad, y, weight, ctx.has_bias)
        del y
        grad_y = grad_y.to(x.dtype)
        grad_x, grad_lw, grad_lb = torch.ops.aten.native_layer_norm_backward(
            grad_y, x, [x.shape[-1]], mean, rstd, ln_weight, ln_bias, [True, True, True])
        return grad_x, grad_lw, grad_lb, None, grad_w, grad_b


def norm_linear(x: torch.Tensor, norm: nn.LayerNorm, linear: nn.Linear) -> torch.Tensor:
    """``linear(norm(x))`` through the memory-lean :class:`_LayerNormLinear` (``Block``'s norms are affine)."""
    return _LayerNormLinear.apply(x, norm.weight, norm.bias, norm.eps, linear.weight, linear.bias)



class LeanBlock(Block):
    """The pre-norm block through the memory-lean paths when training on CPU in eager mode."""

    def forward(self, x: torch.Tensor, return_attn: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        if return_attn or not (self.training and torch.is_grad_enabled() and eager_cpu(x)):
            return super().forward(x, return_attn)
        x = x + self._attention(norm_linear(x, self.norm1, self.attn.qkv))
        return x + self._mlp(norm_linear(x, self.norm2, self.mlp.fc1)), None

    def _attention(self, qkv: torch.Tensor) -> torch.Tensor:
        p, path = self.attn.attn_dropout, self.attn.path
        if path == "explicit":  # the explicit ops with the memory-lean autograd (p = 0: no mask)
            out = _DropAttention.apply(qkv, self.attn.heads, p if 0 < p < 1 else 0.0)
        else:
            out = sdpa(*self.attn.split_heads(qkv), p, path)  # q, k, v, each (B, heads, T, head_dim)
        return self.attn.merge_heads(out)

    def _mlp(self, a: torch.Tensor) -> torch.Tensor:
        """``MLP.from_hidden`` with GELU, dropout and fc2 recomputed in backward (``MLP``'s act is exact GELU)."""
        mlp, p = self.mlp, self.mlp.drop.p
        if 0 < p < 1:
            keep = dropout_keep(a, p)
            return mlp.drop(_GeluDropLinear.apply(a, keep, 1.0 / (1.0 - p), mlp.fc2.weight, mlp.fc2.bias))
        return mlp.from_hidden(a)
