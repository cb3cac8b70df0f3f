"""macspec: lossless speculative decoding for local chat on MLX."""

__version__ = "0.1.0"
