"""`python -m linnet`: the same command line as `linnet`."""

from linnet.cli import main

main()
