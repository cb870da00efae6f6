"""Select what the module reads: the question asked of the built module (on an isolated twin), its kept
answers, the rank's share, and the fallbacks where it cannot be asked (the table and the conventions)."""
