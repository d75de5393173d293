"""Attention kernels for NVIDIA GPUs in Pallas with Triton lowering: flash attention by segment ids with an offset
causal mask (flash.py, the shared-prefix update) and paged decode attention reading the KV pages in place (paged.py),
with their float64 torch reference (reference_torch.py)."""
