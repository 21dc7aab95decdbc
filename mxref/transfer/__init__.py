"""The data path: the NIXL transfer manager, the chunked READ with its stall and deadline rules,
and where a reader lands the bytes (``read_target``)."""
