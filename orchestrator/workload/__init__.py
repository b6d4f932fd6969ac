"""Workload: ShareGPT dataset, faithful tokenizer, random prompts and the benchmark batch."""
