"""commtrace's interactive dashboard (Dash): `commtrace dashboard DIR`.

:func:`dashboard.app.build` caches what the views need (:class:`dashboard.data.RunData`) and
returns the app; figures are built server-side by :mod:`dashboard.figures` from that cache.
(Callers import `dashboard.app` directly: an editable install made before this file existed
treats `dashboard` as a namespace package and skips this module.)"""
