// Running named checks and reporting each as one `RESULT {json}` line on stdout, for the
// Python runners of the compat families (tests/compat/*/run) to collect.
package rill.compat;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

public final class Checks {
    /** One check: throws (usually `CheckFailed`) when what the client observed is wrong. */
    @FunctionalInterface
    public interface Check {
        void run() throws Exception;
    }

    public static final class CheckFailed extends RuntimeException {
        public CheckFailed(String message) {
            super(message);
        }
    }

    private final Map<String, Check> checks = new LinkedHashMap<>();
    private final long timeoutSeconds;

    public Checks(long timeoutSeconds) {
        this.timeoutSeconds = timeoutSeconds;
    }

    public void add(String name, Check check) {
        checks.put(name, check);
    }

    public static void check(boolean condition, String message) {
        if (!condition) {
            throw new CheckFailed(message);
        }
    }

    public static void checkEquals(Object expected, Object actual, String what) {
        if (expected == null ? actual != null : !expected.equals(actual)) {
            throw new CheckFailed(what + ": expected " + expected + ", got " + actual);
        }
    }

    /**
     * Runs the checks named in `only` (all when empty), each on a fresh thread with a time
     * limit, and returns how many failed. `--list` prints the names instead.
     */
    public int runAll(List<String> only) {
        if (only.contains("--list")) {
            checks.keySet().forEach(System.out::println);
            return 0;
        }
        int failed = 0;
        List<String> names = only.isEmpty() ? new ArrayList<>(checks.keySet()) : only;
        for (String name : names) {
            Check check = checks.get(name);
            if (check == null) {
                report(name, "failed", "no such check", 0);
                failed++;
                continue;
            }
            long started = System.nanoTime();
            ExecutorService executor = Executors.newSingleThreadExecutor(r -> {
                Thread thread = new Thread(r, "check-" + name);
                thread.setDaemon(true);
                return thread;
            });
            String outcome = "passed";
            String reason = "";
            try {
                Future<?> future = executor.submit(() -> {
                    check.run();
                    return null;
                });
                future.get(timeoutSeconds, TimeUnit.SECONDS);
            } catch (TimeoutException e) {
                outcome = "failed";
                reason = "timed out after " + timeoutSeconds + "s";
            } catch (java.util.concurrent.ExecutionException e) {
                outcome = "failed";
                reason = describe(e.getCause());
            } catch (InterruptedException e) {
                outcome = "failed";
                reason = "interrupted";
            } finally {
                executor.shutdownNow();
            }
            if (!outcome.equals("passed")) {
                failed++;
            }
            report(name, outcome, reason, (System.nanoTime() - started) / 1e9);
        }
        return failed;
    }

    static String describe(Throwable error) {
        if (error instanceof CheckFailed) {
            return error.getMessage();
        }
        StringBuilder text = new StringBuilder();
        Throwable cause = error;
        while (cause != null && text.length() < 600) {
            if (text.length() > 0) {
                text.append(" <- ");
            }
            text.append(cause.getClass().getSimpleName()).append(": ").append(cause.getMessage());
            cause = cause.getCause();
        }
        return text.toString();
    }

    static void report(String name, String outcome, String reason, double seconds) {
        System.out.println("RESULT {\"name\": " + json(name) + ", \"outcome\": " + json(outcome)
                + ", \"reason\": " + json(reason) + ", \"seconds\": "
                + String.format(java.util.Locale.ROOT, "%.2f", seconds) + "}");
        System.out.flush();
    }

    static String json(String text) {
        StringBuilder out = new StringBuilder("\"");
        for (char c : text.toCharArray()) {
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
                default -> {
                    if (c < 0x20) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
                }
            }
        }
        return out.append('"').toString();
    }
}
