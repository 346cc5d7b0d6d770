"""`python -m pi2` — the same as the `pi2` console script."""
from pi2.cli.main import main

main()
