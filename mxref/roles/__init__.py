"""The processes' roles: a source (holds a model, publishes it, answers manifest requests with
``mxref.worker_service``) and a reader (finds sources through ``client``, chooses with ``selection``, reads)."""
