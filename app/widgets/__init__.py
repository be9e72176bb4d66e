"""Widgets and styles every screen shares (Configure, the Monitor, the Runs list, Compare), so a
dialog or a status reads the same wherever it shows. Nothing here imports a screen."""
