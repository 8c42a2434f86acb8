"""Pure-numpy references: slow, obvious, the specification the C kernels are tested against."""
