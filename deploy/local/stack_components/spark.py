"""The local stack's Spark: pyspark's jars and the Kafka source and Delta resolved
from Maven Central, verified with a local session."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from stack_components.base import (
    Component,
    Health,
    StackError,
    maven_classpath,
    maven_digest,
    run,
    say,
    state_dir,
)


class Spark(Component):
    """PySpark (from PyPI, via the virtualenv) plus the Kafka source and Delta jars.

    Not a server: Spark runs inside the kafka2spark job (local[2] by default). "Healthy"
    means pyspark imports, every jar is in the local Maven cache, and the jars were
    resolved from the current pom and verified with the current pyspark: ``up`` starts one
    local session offline, reads nothing, and loads the Kafka source and the Delta catalog
    classes, once per jar set, pom and pyspark version. A pom or pyspark that changed since
    makes the component unhealthy, so ``up`` resolves and verifies again.
    """

    def __init__(self) -> None:
        super().__init__("spark")
        self.jars_file = self.dir / "jars.txt"
        self.verified = self.dir / "verified.stamp"
        self.classpath_stamp = self.dir / "classpath.stamp"  # written by maven_classpath

    def pyspark_jars_dir(self) -> Path | None:
        try:
            import pyspark
        except ImportError:
            return None
        return Path(pyspark.__file__).parent / "jars"

    def select_jars(self, resolved: list[str]) -> list[str]:
        """Drop jars pyspark already ships (scala-library, hadoop client...) to avoid duplicates."""
        jars_dir = self.pyspark_jars_dir()
        shipped = {p.name for p in jars_dir.glob("*.jar")} if jars_dir else set()
        keep = []
        for jar in resolved:
            path = Path(jar)
            artifact = path.parent.parent.name
            if any(
                name.startswith(artifact + "-") and name[len(artifact) + 1 :][:1].isdigit()
                for name in shipped
            ):
                continue
            keep.append(jar)
        return keep

    def install(self) -> None:
        jars = self.select_jars(maven_classpath("spark"))
        self.jars_file.write_text(",".join(jars))

    def jars(self) -> list[str]:
        try:
            return [j for j in self.jars_file.read_text().strip().split(",") if j]
        except OSError:
            return []

    def health(self) -> Health:
        if self.pyspark_jars_dir() is None:
            return Health(self.name, "missing", None, None, "pyspark not installed", str(self.log))
        jars = self.jars()
        if not jars or not all(Path(j).exists() for j in jars):
            return Health(
                self.name, "missing", None, None, "connector jars not resolved", str(self.log)
            )
        why = self.stale()
        if why:
            return Health(self.name, "unhealthy", None, None, why, str(self.log))
        return Health(
            self.name,
            "ready",
            None,
            None,
            f"pyspark {self.pyspark_version()}, {len(jars)} connector jars",
            str(self.log),
        )

    def pyspark_version(self) -> str:
        import pyspark

        return str(pyspark.__version__)

    def jar_digest(self) -> str:
        return hashlib.sha256(",".join(self.jars()).encode()).hexdigest()[:16]

    def fingerprint(self) -> dict[str, str]:
        """What a verification holds for: the selected jars, the pom they were resolved
        from and the pyspark that selected (``select_jars``) and loaded them."""
        return {
            "jars": self.jar_digest(),
            "pom": maven_digest(self.name),
            "pyspark": self.pyspark_version(),
        }

    def stale(self) -> str:
        """Why the selected jars are not known good for the current pom and pyspark;
        empty when they are."""
        pom = maven_digest(self.name)
        try:
            resolved_from = self.classpath_stamp.read_text().strip()
        except OSError:
            resolved_from = ""
        if resolved_from != pom:
            return "pom.xml changed since the jars were resolved"
        try:
            verified = json.loads(self.verified.read_text())
        except (OSError, ValueError):
            verified = None
        if not isinstance(verified, dict):  # none yet, or a stamp of an older stack
            return "jars not verified yet"
        now = self.fingerprint()
        if verified.get("pyspark") != now["pyspark"]:
            return f"jars verified with pyspark {verified.get('pyspark')}, not {now['pyspark']}"
        if verified.get("pom") != now["pom"]:
            return "pom.xml changed since the jars were verified"
        if verified.get("jars") != now["jars"]:
            return "jars changed since they were verified"
        return ""

    def up(self) -> bool:
        if self.health().ok:
            return False
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.pyspark_jars_dir() is None:
            raise StackError(
                self.name, "import pyspark", "pyspark missing: run through deploy/local/walcast"
            )
        self.install()
        say("spark: verifying a local session loads the Kafka source and Delta (first run only)")
        code = (
            "import sys\n"
            "from pyspark.sql import SparkSession\n"
            "s = (SparkSession.builder.master('local[1]').appName('walcast-stack-check')"
            ".config('spark.ui.enabled','false').config('spark.jars', sys.argv[1])"
            ".config('spark.sql.extensions','io.delta.sql.DeltaSparkSessionExtension')"
            ".config('spark.sql.catalog.spark_catalog','org.apache.spark.sql.delta.catalog.DeltaCatalog')"
            ".getOrCreate())\n"
            "jvm = s.sparkContext._jvm\n"
            "for c in ('org.apache.spark.sql.kafka010.KafkaSourceProvider',"
            " 'io.delta.tables.DeltaTable'):\n"
            "    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()\n"
            "    jvm.java.lang.Class.forName(c, True, loader)\n"
            "print('spark', s.version, 'ok')\n"
            "s.stop()\n"
        )
        run(
            [sys.executable, "-c", code, ",".join(self.jars())],
            self.name,
            "start a local session with the connector jars",
            self.log,
            timeout=300,
        )
        self.verified.write_text(json.dumps(self.fingerprint(), sort_keys=True))
        return True

    def stop(self) -> None:
        return

    def env(self) -> dict[str, str]:
        jars = ",".join(self.jars())
        return {
            "WALCAST_SPARK_JARS": jars,
            "KAFKA2SPARK_SPARK__JARS": jars,  # the job starts offline with these
            "KAFKA2SPARK_DELTA__ROOT": str(state_dir() / "delta"),
        }
