"""The notebooks' interface: controls, a reusable figure, plots, and one module per panel.
Imports matplotlib and ipywidgets; the simulator itself never imports this package."""
