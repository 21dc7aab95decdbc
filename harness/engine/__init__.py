"""The engine: a run's phases (runner), processes, faults in time (nemesis), waits, watchers, proxies."""
