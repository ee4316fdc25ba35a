"""kvflash's benchmark driver: ``python -m kvflash.bench`` runs kvflash and its peers (PyTorch
SDPA flash / cuDNN, FlexAttention dense and paged, FlashInfer, FlashAttention-4) on the same
inputs, checks every peer's output against kvflash's (MLA and fp8-cache rows: every system's
against a float32 torch reference), and writes a CSV, a markdown table and plots. See
__main__.py for the command line and .team/bench-notes.md / BENCHMARKS.md for use."""
