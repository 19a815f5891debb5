// Runs Kafka's command-line tools in one JVM, one after another, so that a family of tool
// checks pays for one JVM start and one class load rather than one per command (on two
// shared cores a tool's JVM takes seconds to start). Protocol, one JSON object per line:
//   stdin:  {"main": "org.apache.kafka.tools.TopicCommand", "args": [...], "stdin": "..."}
//   stdout: {"code": 0, "output": "what the tool printed on stdout and stderr"}
// A tool's Exit.exit(code) records the code instead of ending the JVM (Exit.setExitProcedure;
// the first call wins, as it would have ended the process). It cannot throw to unwind the
// tool: the tools catch Throwable around their work. The shutdown hooks a tool adds
// (Exit.addShutdownHook: the console producer flushes and closes its producer in one) run
// when its main returns, as they would when its process ended. System.in, out and err are
// the request's and a buffer for the time the tool runs.
package rill.compat;

import java.io.BufferedReader;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.lang.reflect.InvocationTargetException;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;

import com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.kafka.common.utils.Exit;

public final class ToolBatch {
    /** The first exit code a tool asked for during the current command, or null. */
    private static Integer exitCode;

    private static synchronized void recordExit(int code) {
        if (exitCode == null) {
            exitCode = code;
        }
    }

    private static synchronized Integer takeExit() {
        Integer code = exitCode;
        exitCode = null;
        return code;
    }

    /** The shutdown hooks the current command added, run in order after it returns. */
    private static final List<Thread> HOOKS = new java.util.ArrayList<>();

    private static void runHooks(PrintStream captured) {
        List<Thread> hooks;
        synchronized (HOOKS) {
            hooks = new java.util.ArrayList<>(HOOKS);
            HOOKS.clear();
        }
        for (Thread hook : hooks) {
            hook.start();
            try {
                hook.join(30_000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return;
            }
            if (hook.isAlive()) {
                captured.println("ToolBatch: shutdown hook " + hook.getName() + " still running after 30 s");
            }
        }
    }

    public static void main(String[] argv) throws Exception {
        ObjectMapper json = new ObjectMapper();
        PrintStream out = System.out;
        PrintStream err = System.err;
        InputStream in = System.in;
        Exit.setExitProcedure((code, message) -> recordExit(code));
        Exit.setHaltProcedure((code, message) -> recordExit(code));
        Exit.setShutdownHookAdder((name, runnable) -> {
            synchronized (HOOKS) {
                HOOKS.add(new Thread(runnable, name == null ? "tool-shutdown-hook" : name));
            }
        });
        BufferedReader requests = new BufferedReader(new InputStreamReader(in, StandardCharsets.UTF_8));
        String line;
        while ((line = requests.readLine()) != null) {
            if (line.isBlank()) {
                continue;
            }
            @SuppressWarnings("unchecked")
            Map<String, Object> request = json.readValue(line, Map.class);
            String mainClass = (String) request.get("main");
            @SuppressWarnings("unchecked")
            List<String> args = (List<String>) request.get("args");
            String stdin = (String) request.getOrDefault("stdin", "");
            ByteArrayOutputStream buffer = new ByteArrayOutputStream();
            PrintStream captured = new PrintStream(buffer, true, StandardCharsets.UTF_8);
            int code = 0;
            takeExit();
            System.setOut(captured);
            System.setErr(captured);
            System.setIn(new ByteArrayInputStream((stdin == null ? "" : stdin).getBytes(StandardCharsets.UTF_8)));
            try {
                Class.forName(mainClass).getMethod("main", String[].class)
                        .invoke(null, (Object) args.toArray(new String[0]));
            } catch (InvocationTargetException e) {
                code = 1;
                e.getCause().printStackTrace(captured);
            } catch (Exception e) {
                code = 1;
                e.printStackTrace(captured);
            } finally {
                runHooks(captured);
                captured.flush();
                System.setOut(out);
                System.setErr(err);
                System.setIn(in);
            }
            Integer exit = takeExit();
            if (exit != null) {
                code = exit;
            }
            out.println(json.writeValueAsString(Map.of("code", code,
                    "output", buffer.toString(StandardCharsets.UTF_8))));
            out.flush();
        }
    }
}
