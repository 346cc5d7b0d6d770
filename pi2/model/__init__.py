"""pi2.model — reading models: GGUF container, ModelConfig, tokenizer, chat template."""
