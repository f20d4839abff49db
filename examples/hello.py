"""hello.py — the README's Python example. Run: collie-run -n 4 -- python3 examples/hello.py
(with python/ on PYTHONPATH, or the package installed)."""
import collie, numpy as np

eng = collie.Engine()
comm = collie.Comm.from_env(eng, timeout=5, policy="abort_comm")  # blocks until every rank came
x = np.full(4, comm.rank + 1, np.float32)
work = comm.allreduce(x)  # returns at once; the sum lands in x (in place)
work.wait()  # bounded by timeout=5 s; raises CollieTimeout, ColliePeerError, ...
print(f"rank {comm.rank}: x[0] = {x[0]} (the sum over {comm.size} ranks)")
comm.destroy()
eng.close()
