"""Machine state: the state directory, the ledger of live runs, run scopes, process scans, the machine share, ports."""
