"""Imported first by kvsim's Dask fork server (kvsim.study.daskclient.WORKER_MODULES), and
only there: from here on the fork server ignores SIGINT, as Python's fork server goes on
to do, and so do the workers it forks. A terminal's Ctrl-C reaches the whole process
group; it is the command's to handle (it closes the cluster), not a traceback from the
fork server's imports cut short. (The command itself ignores nothing: a Ctrl-C is never
lost there.)"""

import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)
# it may have started with SIGINT blocked (kvsim.study.daskclient.spawn_ignoring_sigint):
# ignored now, a Ctrl-C pending since is dropped, and the mask is as any process's
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
