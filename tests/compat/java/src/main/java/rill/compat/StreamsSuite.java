// The `kafka-streams` compat family: a stateful Kafka Streams word count (a repartition by
// word, a count store with its changelog topic) under at_least_once and exactly_once_v2.
// Usage: StreamsSuite BOOTSTRAP STATE_DIR [CHECK...|--list]; one RESULT line per check.
package rill.compat;

import static rill.compat.Checks.check;
import static rill.compat.Checks.checkEquals;

import java.nio.file.Path;
import java.time.Duration;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.LongDeserializer;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Produced;

public final class StreamsSuite {
    private static final String[] WORDS = {"alpha", "beta", "gamma", "delta", "epsilon"};
    private static final int LINES = 500;

    private final String bootstrap;
    private final Path stateDir;

    private StreamsSuite(String bootstrap, Path stateDir) {
        this.bootstrap = bootstrap;
        this.stateDir = stateDir;
    }

    public static void main(String[] args) {
        if (args.length < 2) {
            System.err.println("usage: StreamsSuite BOOTSTRAP STATE_DIR [CHECK...|--list]");
            System.exit(2);
        }
        StreamsSuite suite = new StreamsSuite(args[0], Path.of(args[1]));
        Checks checks = new Checks(150);
        checks.add("wordcount_at_least_once", () -> suite.wordCount(StreamsConfig.AT_LEAST_ONCE));
        checks.add("wordcount_exactly_once_v2", () -> suite.wordCount(StreamsConfig.EXACTLY_ONCE_V2));
        System.exit(Math.min(checks.runAll(Arrays.asList(args).subList(2, args.length)), 100));
    }

    private void wordCount(String guarantee) throws Exception {
        String run = guarantee.replace('_', '-') + "-" + UUID.randomUUID().toString().substring(0, 6);
        String input = "streams-lines-" + run;
        String output = "streams-counts-" + run;
        String appId = "wordcount-" + run;
        Properties adminProps = new Properties();
        adminProps.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(adminProps)) {
            admin.createTopics(List.of(new NewTopic(input, 2, (short) 1), new NewTopic(output, 1, (short) 1)))
                    .all().get(30, TimeUnit.SECONDS);
        }
        // Line i holds WORDS[i % 5] and WORDS[(i + 1) % 5]: every word is counted 2 * LINES / 5 times.
        Map<String, Long> expected = new HashMap<>();
        Properties producerProps = new Properties();
        producerProps.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        producerProps.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        producerProps.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(producerProps)) {
            for (int i = 0; i < LINES; i++) {
                String line = WORDS[i % WORDS.length] + " " + WORDS[(i + 1) % WORDS.length];
                for (String word : line.split(" ")) {
                    expected.merge(word, 1L, Long::sum);
                }
                producer.send(new ProducerRecord<>(input, "line" + i, line));
            }
            producer.flush();
        }

        StreamsBuilder builder = new StreamsBuilder();
        builder.<String, String>stream(input)
                .flatMapValues(line -> Arrays.asList(line.split(" ")))
                .groupBy((key, word) -> word, Grouped.with(Serdes.String(), Serdes.String()))
                .count()
                .toStream()
                .to(output, Produced.with(Serdes.String(), Serdes.Long()));
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, guarantee);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.resolve(appId).toString());
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.String().getClass());
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.String().getClass());
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 200);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");

        Map<String, Long> latest = new HashMap<>();
        try (KafkaStreams streams = new KafkaStreams(builder.build(), props)) {
            streams.start();
            Properties consumerProps = new Properties();
            consumerProps.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            consumerProps.put(ConsumerConfig.GROUP_ID_CONFIG, "verify-" + run);
            consumerProps.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
            consumerProps.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
            try (KafkaConsumer<String, Long> consumer = new KafkaConsumer<>(consumerProps,
                    new StringDeserializer(), new LongDeserializer())) {
                consumer.subscribe(List.of(output));
                long deadline = System.currentTimeMillis() + 120_000;
                while (!latest.equals(expected) && System.currentTimeMillis() < deadline) {
                    check(streams.state() != KafkaStreams.State.ERROR, "streams went to ERROR");
                    for (ConsumerRecord<String, Long> record : consumer.poll(Duration.ofMillis(300))) {
                        latest.put(record.key(), record.value());
                    }
                }
            }
            checkEquals(expected, latest, "latest count per word (state " + streams.state() + ")");
            Set<String> topics;
            Properties adminAgain = new Properties();
            adminAgain.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            try (Admin admin = Admin.create(adminAgain)) {
                topics = admin.listTopics().names().get(30, TimeUnit.SECONDS);
            }
            check(topics.stream().anyMatch(t -> t.startsWith(appId) && t.endsWith("-changelog")),
                    "no changelog topic for " + appId);
            check(topics.stream().anyMatch(t -> t.startsWith(appId) && t.endsWith("-repartition")),
                    "no repartition topic for " + appId);
            streams.close(Duration.ofSeconds(30));
        }
    }
}
