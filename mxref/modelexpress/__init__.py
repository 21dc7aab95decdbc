"""ModelExpress compatibility outside the metadata server: its WorkerService on a source
(``worker``), its control-plane messages (``control``), and the adapter that runs the real
ModelExpress client as a harness subject (``adapter``)."""
