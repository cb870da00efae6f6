"""Was a weight lost? One stage answers, before streaming and after loading.

Before a byte streams, :func:`.kept.before_streaming` says which parameters the
module keeps that the names planned would leave in part (the module question,
:mod:`..select.module_reads`, refuses such a load). After the engine's weight
loading, :func:`.after.after_loading` checks the stream off (:mod:`.ledger`:
every planned tensor once, as its header said, its bytes where checked) and
the model (what ``load_weights`` reported, what the load wrote, the engine's
per-shard marks). robust, doctor and the chain guard call those two entries.
"""
