"""The answerers of "which tensors does a draft that cannot be asked read?" as they were before issue 53
(mtp_table.py: the table; draft.py: the naming conventions), kept as test-only code so that
tests/test_draft_answerers.py can compare the one answerer that replaced them with both."""
