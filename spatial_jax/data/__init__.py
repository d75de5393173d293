"""Records, JSONL reading, the synthetic spatial world, the local tokenizer, image preprocessing, prompts.

Entry points (import the submodule; this package imports nothing so the CLI stays light):
  records.Sample / DatasetError        one question about one image; Sample.to_rollout(completion) for the rewards
  jsonl.read_jsonl / write_jsonl       JSONL datasets (errors name path:line)
  sources.open_spec / parse_spec       any source spec: JSONL, synthetic, a published copy FORMAT:PATH, mix:
  synthetic.SyntheticConfig, make_sample, SyntheticSource, generate   the embedded spatial world
  tokenizer.build_tokenizer()          the Qwen3-VL-shaped byte-level tokenizer (encode, decode_with_offsets, ids)
  prompts.build_messages / thinking    each method's prompt
  pipeline.DataConfig, train_iterator, eval_iterator, make_iterator, blank_batch   grain batches
"""
