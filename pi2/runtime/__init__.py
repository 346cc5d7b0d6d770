"""pi2.runtime — running a model: the run's configuration, its plan, opening the model and its context, the
generation loop, sampling, perplexity and bench."""
