"""``mxchaos mutate``: how many planted bugs a scenario selection catches, and how.

Each mutant is a ``git diff`` of the subject's package (a file ``*.diff`` or ``*.patch`` in a
folder). ``subject`` copies the package into a scratch folder and applies one mutant there (the
user's tree is never touched); ``runs`` runs the selection with that copy first on the subject's
processes' path (the harness itself keeps its own code: it is the oracle), a baseline with the
unmutated copy first, and reruns what a mutant killed only through time bounds; ``killmatrix``
classifies each run and writes ``mutate.json`` and ``mutate.html`` (which scenario killed which
mutant, by which check, timing-only or not); ``command`` is the sub-command.
"""
