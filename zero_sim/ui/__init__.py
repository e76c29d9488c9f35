"""The notebooks' interface: shared controls (:mod:`.controls`), panel base classes
(:mod:`.panel`), a reusable figure (:mod:`.figure`), one module per panel (:mod:`.panels`),
and the plots (:mod:`.plots`).

The panels need ipywidgets; the plots need only matplotlib, so the CLI and ``SimResult``
draw with them too, loading them only when a picture is asked for.  Nothing outside this
package depends on the widgets.
"""
