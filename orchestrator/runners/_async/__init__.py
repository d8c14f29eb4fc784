"""The engine as written: async. ``_sync`` holds its generated twin."""
