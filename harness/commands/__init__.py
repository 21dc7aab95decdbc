"""Sub-commands of ``mxchaos`` that live outside ``harness.cli`` (the registry): each module has
``add_parser(sub)`` registering its commands and the functions they run."""
