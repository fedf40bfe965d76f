"""The lowest layer of the web app: helpers every package may use and that use no model or
other package: settings from the environment, the trust boundary, paths in the data dir,
sending tasks by name, CSV cells, series downsampling, the CSP middleware.
"""
