"""Tools that compare, calibrate and fit: ``kvsim compare`` and ``kvsim diff``
(``compare``, ``reports``), ``kvsim calibrate`` (``calibrate``; what it measures,
``measured``; its pure fit, ``fit``), and the hw backend's own software costs that
compare's sim side adds (``hwloop``). They build configs and read results; none of them
is imported by a replay."""
