"""The notebooks' interface: shared controls (:mod:`.controls`), what each control offers
(:mod:`.offers`, asking :mod:`.refusals` what the simulator would refuse), the headline
words (:mod:`.text`), panel base classes (:mod:`.panel`), a reusable figure (:mod:`.figure`),
one module per panel (:mod:`.panels`), the plots (:mod:`.plots`) and the look they share
(:mod:`.style`: width, palette, legends).

The panels need ipywidgets; the plots need only matplotlib, so the CLI and ``SimResult``
draw with them too, loading them only when a picture is asked for.  Nothing outside this
package depends on the widgets.
"""
