"""The `torchdeck` console script: argument parsing and text rendering over the engine's run core
(engine.runs) and the app (app.main). It holds no logic of its own."""
