"""tests.fuzz — the structure-aware GGUF fuzzer: gguf_map.py finds every field, mutate.py damages files,
run.py drives workers over pi2's commands and classifies what they do."""
