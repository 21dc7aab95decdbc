"""What a person reads: the run folder, the console, the pages of runs, invocations, nights and matrices."""
