"""`mxchaos matrix`: scenarios x NIXL versions (x env axes), each cell a repeated run."""
