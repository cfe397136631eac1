"""CLI subcommands: one module each, with ``add_arguments(parser)`` and ``main(args)``."""
