"""The Qwen3-VL policy in Flax NNX, LoRA, Hugging Face checkpoints in and out, sharding rules."""
