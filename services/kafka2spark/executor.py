"""``walcast-spark-executor``: the command of kafka2spark's executor pods on Kubernetes.

With ``spark.master`` ``k8s://...`` the driver (the kafka2spark pod) creates executor pods
from the same image and passes what each executor needs in its environment
(``SPARK_DRIVER_URL``, ``SPARK_EXECUTOR_ID``, ``SPARK_EXECUTOR_CORES``,
``SPARK_EXECUTOR_MEMORY``, ``SPARK_APPLICATION_ID``, ``SPARK_EXECUTOR_POD_IP``,
``SPARK_EXECUTOR_POD_NAME``, ``SPARK_RESOURCE_PROFILE_ID``, the JVM options as
``SPARK_JAVA_OPT_<n>``) and the argument ``executor``. Spark's own images start the
executor backend from a shell entry point; walcast's image is Python with pip's pyspark,
so this module does it: the JVM with pyspark's jars (and ``SPARK_EXTRA_CLASSPATH``), the
module options Spark needs on Java 17, and ``KubernetesExecutorBackend``. It replaces
itself with the JVM (``exec``), so the pod's signals reach the executor directly.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

BACKEND = "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend"

# What Spark's launcher adds on Java 17 (org.apache.spark.launcher.JavaModuleOptions).
MODULE_OPTIONS = [
    f"--add-opens=java.base/{package}=ALL-UNNAMED"
    for package in (
        "java.lang", "java.lang.invoke", "java.lang.reflect", "java.io", "java.net",
        "java.nio", "java.util", "java.util.concurrent", "java.util.concurrent.atomic",
        "jdk.internal.ref", "sun.nio.ch", "sun.nio.cs", "sun.security.action",
        "sun.util.calendar",
    )
] + [
    "-Djdk.reflect.useDirectMethodHandle=false",
    "-Dio.netty.tryReflectionSetAccessible=true",
]  # fmt: skip

REQUIRED = (
    "SPARK_DRIVER_URL",
    "SPARK_EXECUTOR_ID",
    "SPARK_EXECUTOR_CORES",
    "SPARK_EXECUTOR_MEMORY",
    "SPARK_APPLICATION_ID",
    "SPARK_EXECUTOR_POD_IP",
)


class ExecutorEnvError(RuntimeError):
    """Not started by a Spark driver: the variables it sets are missing."""


def pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def java_options(env: Mapping[str, str]) -> list[str]:
    """``SPARK_JAVA_OPT_0``, ``SPARK_JAVA_OPT_1``, ... in their numeric order."""
    found = []
    for name, value in env.items():
        m = re.fullmatch(r"SPARK_JAVA_OPT_(\d+)", name)
        if m:
            found.append((int(m.group(1)), value))
    return [value for _, value in sorted(found)]


def command(env: Mapping[str, str], java: str, jars: Path) -> list[str]:
    """The executor's JVM command line from the driver-given environment."""
    missing = [name for name in REQUIRED if not env.get(name)]
    if missing:
        raise ExecutorEnvError(
            f"missing {', '.join(missing)}: walcast-spark-executor runs in executor pods"
            " that kafka2spark's Spark driver creates (spark.master k8s://...), not by hand"
        )
    classpath = [f"{jars}/*"]
    for extra in (env.get("SPARK_EXTRA_CLASSPATH"), env.get("SPARK_CLASSPATH")):
        if extra:
            classpath.append(extra)
    memory = env["SPARK_EXECUTOR_MEMORY"]
    args = [
        java,
        *MODULE_OPTIONS,
        *java_options(env),
        f"-Xms{memory}",
        f"-Xmx{memory}",
        "-cp",
        ":".join(classpath),
        BACKEND,
        "--driver-url", env["SPARK_DRIVER_URL"],
        "--executor-id", env["SPARK_EXECUTOR_ID"],
        "--cores", env["SPARK_EXECUTOR_CORES"],
        "--app-id", env["SPARK_APPLICATION_ID"],
        "--hostname", env["SPARK_EXECUTOR_POD_IP"],
        "--resourceProfileId", env.get("SPARK_RESOURCE_PROFILE_ID", "0"),
    ]  # fmt: skip
    if env.get("SPARK_EXECUTOR_POD_NAME"):
        args += ["--podName", env["SPARK_EXECUTOR_POD_NAME"]]
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv != ["executor"]:
        print(f"walcast-spark-executor: unexpected arguments {argv}", file=sys.stderr)
        return 2
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if java is None:
        print("walcast-spark-executor: no java on PATH and JAVA_HOME unset", file=sys.stderr)
        return 1
    try:
        cmd = command(os.environ, java, pyspark_jars())
    except ExecutorEnvError as exc:
        print(f"walcast-spark-executor: {exc}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    os.execv(java, cmd)  # noqa: S606 - the argv is built above, no shell


if __name__ == "__main__":
    sys.exit(main())
