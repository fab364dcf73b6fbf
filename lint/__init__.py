"""The TGM flake8 plugin (see flake8_torch_gradmode)."""
