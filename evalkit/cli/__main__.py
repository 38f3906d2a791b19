"""`python -m evalkit.cli`."""

from evalkit.cli import main

main()
