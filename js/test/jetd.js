// Starts jetd (python -m jetd from this repository) for the tests that run against one.
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";

const repo = fileURLToPath(new URL("../../", import.meta.url));
const python = process.env.JET_PYTHON ?? "python3";

/** Start jetd on free ports; resolves {proc, tcp: "tcp://...", ws: "ws://.../jet"}. */
export function startJetd(...args) {
  const proc = spawn(python, ["-m", "jetd", "--port", "0", "--http-port", "0", ...args], {
    cwd: repo, env: { ...process.env, PYTHONPATH: repo, PYTHONUNBUFFERED: "1" }, stdio: ["ignore", "pipe", "pipe"],
  });
  let stderr = "";
  proc.stderr.on("data", (d) => { stderr += d; });
  return new Promise((resolve, reject) => {
    let out = "";
    const timer = setTimeout(() => reject(new Error(`jetd did not start: ${stderr}`)), 15000);
    proc.stdout.on("data", (d) => {
      out += d;
      const tcp = /jetd listening on (\S+)/.exec(out);
      const web = /web on (https?):\/\/(\S+?)\//.exec(out);
      if (tcp && web) {
        clearTimeout(timer);
        const ws = `${web[1] === "https" ? "wss" : "ws"}://${web[2]}/jet`;
        resolve({ proc, tcp: `tcp://${tcp[1]}`, ws, stderr: () => stderr });
      }
    });
    proc.on("exit", (code) => reject(new Error(`jetd exited ${code}: ${stderr}`)));
  });
}

/** SIGTERM to a jetd of startJetd; resolves its exit code (0: it shut down cleanly). */
export function stopJetd(jetd) {
  return new Promise((resolve) => {
    if (jetd.proc.exitCode !== null) return resolve(jetd.proc.exitCode);
    jetd.proc.on("exit", resolve);
    jetd.proc.kill("SIGTERM");
  });
}
