"""Subcommands of ``memstaged``; each module has ``register(subparsers)``."""
