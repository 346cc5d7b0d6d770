"""pi2 — LLM inference that computes only the FFN neurons a token activates (PowerInfer-2 design)."""
__version__ = "0.1.0"
