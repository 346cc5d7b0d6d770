"""`python -m pi2` — the same as the `pi2` console script."""
from pi2.cli.app import main

main()
