"""Plan the load: the shards and names it streams, and the answer that decided them; agreed between ranks."""
