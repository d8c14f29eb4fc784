"""Operator tools built on the library: the command line, the demo, the chaos run, status
and the transition graph."""
