"""Records, JSONL reading, the synthetic spatial world, the local tokenizer, image preprocessing, prompts."""
