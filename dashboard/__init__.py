"""commtrace's interactive dashboard (Dash): `commtrace dashboard DIR`.

The repository's top-level `dashboard/` folder installs as `commtrace.dashboard` (pyproject's
package-dir), so import it as `commtrace.dashboard`; inside it, imports are relative.
:func:`commtrace.dashboard.app.build` caches what the views need (`data.RunData`) and returns
the app; figures are built server-side by `figures` from that cache."""
