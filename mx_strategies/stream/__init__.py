"""Stream what the plan says with runai-model-streamer, verified, and check what the model kept."""
