"""The metadata server: where sources publish themselves and readers find them.

``records`` (what is kept), ``query`` (the one freshness rule and the listing), ``store`` (in
memory) and ``redis_store`` (ModelExpress's Redis layout), ``servicer`` (the RPCs, trusting no
client) with ``limits`` and ``ownership`` (what a request may be and who may write), ``modelexpress``
(ModelExpress's service over the same servicer), ``reaper``, ``transport`` (grpcio or ``native``,
the calls framed in Rust) and ``main`` (the ``server`` role).
"""
