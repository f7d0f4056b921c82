"""Model families. Each constructor takes explicit keyword arguments (no config objects)."""
