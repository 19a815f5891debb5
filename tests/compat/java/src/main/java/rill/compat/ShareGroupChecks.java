// The share-group checks of the `java-client` family (KIP-932, issue #21): Kafka's own
// `KafkaShareConsumer` and the Admin client's share-group calls against one broker (Rill, or
// Kafka 4.1 with `share.version=1` as the reference). Registered by JavaClientSuite.
package rill.compat;

import static rill.compat.Checks.check;
import static rill.compat.Checks.checkEquals;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import java.util.stream.Collectors;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.GroupListing;
import org.apache.kafka.clients.admin.ListGroupsOptions;
import org.apache.kafka.clients.admin.ListShareGroupOffsetsSpec;
import org.apache.kafka.clients.admin.ShareGroupDescription;
import org.apache.kafka.clients.admin.ShareMemberDescription;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.GroupState;
import org.apache.kafka.common.GroupType;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.errors.GroupNotEmptyException;
import org.apache.kafka.common.serialization.StringDeserializer;

final class ShareGroupChecks {
    /** How long a consumer polls on after its last expected record: a redelivery shows here. */
    private static final Duration QUIET = Duration.ofMillis(1500);

    private final JavaClientSuite suite;
    private final Admin admin;
    private final String run;

    ShareGroupChecks(JavaClientSuite suite) {
        this.suite = suite;
        this.admin = suite.admin;
        this.run = suite.run;
    }

    void register(Checks checks) {
        checks.add("share_consumer_implicit_ack_each_record_once", this::implicitAcknowledgement);
        checks.add("share_consumer_explicit_release_reject", this::explicitAcknowledgement);
        checks.add("share_consumer_release_until_delivery_limit", this::deliveryLimit);
        checks.add("share_consumers_two_members_one_partition", this::twoMembersOnePartition);
        checks.add("admin_share_groups", this::adminShareGroups);
        checks.add("admin_share_group_offsets_alter", this::adminAlterShareGroupOffsets);
        checks.add("admin_share_group_offsets_delete_then_reread", this::deleteOffsetsThenReread);
    }

    // ---- helpers ----

    /**
     * The group config `share.auto.offset.reset=earliest` (a GROUP resource), so that the
     * group reads what was produced before it joined; waits until the broker describes it,
     * since a group config reaches the brokers through the metadata log.
     */
    private void startAtEarliest(String group) throws Exception {
        ConfigResource resource = new ConfigResource(ConfigResource.Type.GROUP, group);
        admin.incrementalAlterConfigs(Map.of(resource, List.of(new AlterConfigOp(
                new ConfigEntry("share.auto.offset.reset", "earliest"), AlterConfigOp.OpType.SET))))
                .all().get(30, TimeUnit.SECONDS);
        long deadline = System.currentTimeMillis() + JavaClientSuite.WAIT_MS;
        while (true) {
            ConfigEntry entry = admin.describeConfigs(List.of(resource)).all().get(30, TimeUnit.SECONDS)
                    .get(resource).get("share.auto.offset.reset");
            if (entry != null && "earliest".equals(entry.value())) {
                return;
            }
            check(System.currentTimeMillis() < deadline,
                    "share.auto.offset.reset of " + group + " never described as earliest: " + entry);
            Thread.sleep(100);
        }
    }

    private KafkaShareConsumer<String, String> shareConsumer(String group, Map<String, String> extra) {
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, suite.bootstrap);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.putAll(extra);
        return new KafkaShareConsumer<>(props);
    }

    /** Sends `count` records k0..k(n-1)/v0.. to one partition. */
    private void produceTo(String topic, int partition, int count) throws Exception {
        try (KafkaProducer<String, String> producer = suite.producer(Map.of())) {
            List<java.util.concurrent.Future<?>> sent = new ArrayList<>();
            for (int i = 0; i < count; i++) {
                sent.add(producer.send(new ProducerRecord<>(topic, partition, "k" + i, "v" + i)));
            }
            producer.flush();
            for (var future : sent) {
                future.get(30, TimeUnit.SECONDS);
            }
        }
    }

    /**
     * Polls (implicit acknowledgement: each poll accepts what the previous one gave) until
     * `count` records came, then for QUIET more, so that a record given twice shows.
     */
    private static List<ConsumerRecord<String, String>> pollShare(
            KafkaShareConsumer<String, String> consumer, int count) {
        List<ConsumerRecord<String, String>> records = new ArrayList<>();
        long deadline = System.currentTimeMillis() + JavaClientSuite.WAIT_MS;
        while (records.size() < count && System.currentTimeMillis() < deadline) {
            consumer.poll(Duration.ofMillis(200)).forEach(records::add);
        }
        long quietUntil = System.currentTimeMillis() + QUIET.toMillis();
        while (System.currentTimeMillis() < quietUntil) {
            consumer.poll(Duration.ofMillis(200)).forEach(records::add);
        }
        checkEquals(count, records.size(), "records delivered");
        return records;
    }

    /** Every record of `partitions` partitions with `perPartition` offsets came exactly once. */
    private static void checkEachOnce(List<ConsumerRecord<String, String>> records, String topic,
            int partitions, int perPartition) {
        Set<TopicPartition> seen = new HashSet<>();
        Set<String> ids = new HashSet<>();
        for (ConsumerRecord<String, String> record : records) {
            checkEquals(topic, record.topic(), "topic");
            check(ids.add(record.partition() + "@" + record.offset()),
                    "record " + record.partition() + "@" + record.offset() + " delivered twice");
            checkEquals("v" + record.key().substring(1), record.value(), "value of " + record.key());
            checkEquals(Optional.of((short) 1), record.deliveryCount(),
                    "delivery count of " + record.partition() + "@" + record.offset());
            check(record.offset() < perPartition, "offset beyond the log: " + record.offset());
            seen.add(new TopicPartition(record.topic(), record.partition()));
        }
        checkEquals(partitions * perPartition, ids.size(), "distinct records");
        checkEquals(partitions, seen.size(), "partitions read");
    }

    /** The group's share-partition start offsets, as listShareGroupOffsets gives them. */
    private Map<TopicPartition, Long> startOffsets(String group) throws Exception {
        Map<TopicPartition, OffsetAndMetadata> offsets = admin
                .listShareGroupOffsets(Map.of(group, new ListShareGroupOffsetsSpec()))
                .partitionsToOffsetAndMetadata(group).get(30, TimeUnit.SECONDS);
        Map<TopicPartition, Long> starts = new TreeMap<>(
                (a, b) -> a.toString().compareTo(b.toString()));
        offsets.forEach((tp, offset) -> starts.put(tp, offset == null ? null : offset.offset()));
        return starts;
    }

    /**
     * Every partition of `expected` is listed with a start offset in [0, its end]. Kafka 4.1
     * persists a share-partition's start offset with the write that acknowledges records and
     * only then moves it (`SharePartition.rollbackOrProcessStateUpdates`), so what
     * DescribeShareGroupOffsets reads lags by a write there: the exact value is not checked,
     * what a consumer joining again receives is.
     */
    private void checkStartOffsetsWithin(String group, Map<TopicPartition, Long> ends) throws Exception {
        Map<TopicPartition, Long> starts = startOffsets(group);
        checkEquals(new HashSet<>(ends.keySet()), new HashSet<>(starts.keySet()), "partitions with start offsets");
        ends.forEach((tp, end) -> {
            Long start = starts.get(tp);
            check(start != null && start >= 0 && start <= end, "start offset of " + tp + ": " + start
                    + " (end " + end + ")");
        });
    }

    /**
     * A member joining the group again once the partitions are assigned to it receives
     * nothing: every record was accepted (or rejected) and that was persisted.
     */
    private void checkNothingLeft(String group, String topic, int partitions) throws Exception {
        try (KafkaShareConsumer<String, String> consumer = shareConsumer(group, Map.of())) {
            consumer.subscribe(List.of(topic));
            long deadline = System.currentTimeMillis() + JavaClientSuite.WAIT_MS;
            List<ConsumerRecord<String, String>> got = new ArrayList<>();
            while (true) {
                consumer.poll(Duration.ofMillis(200)).forEach(got::add);
                ShareGroupDescription description;
                try {
                    description = describe(group);
                } catch (ExecutionException e) {
                    description = null;
                }
                if (description != null && description.members().size() == 1 && description.members()
                        .iterator().next().assignment().topicPartitions().size() == partitions) {
                    break;
                }
                check(System.currentTimeMillis() < deadline, "the member never held the " + partitions
                        + " partitions: " + description);
            }
            long quietUntil = System.currentTimeMillis() + QUIET.toMillis();
            while (System.currentTimeMillis() < quietUntil) {
                consumer.poll(Duration.ofMillis(200)).forEach(got::add);
            }
            checkEquals(List.of(), got.stream().map(r -> r.partition() + "@" + r.offset() + " (delivery "
                    + r.deliveryCount().orElse((short) -1) + ")").collect(Collectors.toList()),
                    "records a member joining again received");
        }
    }

    private ShareGroupDescription describe(String group) throws Exception {
        return admin.describeShareGroups(List.of(group)).all().get(30, TimeUnit.SECONDS).get(group);
    }

    /** Waits until the group is described EMPTY (its last member left when it closed). */
    private void awaitEmpty(String group) throws Exception {
        long deadline = System.currentTimeMillis() + JavaClientSuite.WAIT_MS;
        while (true) {
            ShareGroupDescription description = describe(group);
            if (description.groupState() == GroupState.EMPTY && description.members().isEmpty()) {
                return;
            }
            check(System.currentTimeMillis() < deadline, "group never EMPTY: " + description);
            Thread.sleep(100);
        }
    }

    private static void checkAcknowledged(
            Map<TopicIdPartition, Optional<KafkaException>> results, String what) {
        results.forEach((tp, error) -> check(error.isEmpty(),
                what + ": acknowledgement of " + tp + " failed: " + error));
    }

    // ---- checks ----

    /**
     * (a) One share consumer, implicit acknowledgement: every record produced before it
     * joined (two partitions) comes once, with delivery count 1; what it accepted is the
     * group's start offset afterwards.
     */
    private void implicitAcknowledgement() throws Exception {
        String topic = suite.topic("share-implicit");
        suite.createTopic(topic, 2);
        String group = "java-share-implicit-" + run;
        startAtEarliest(group);
        produceTo(topic, 0, 30);
        produceTo(topic, 1, 30);
        try (KafkaShareConsumer<String, String> consumer = shareConsumer(group, Map.of())) {
            consumer.subscribe(List.of(topic));
            checkEquals(Set.of(topic), consumer.subscription(), "subscription");
            checkEachOnce(pollShare(consumer, 60), topic, 2, 30);
            checkAcknowledged(consumer.commitSync(Duration.ofSeconds(30)), "commitSync");
        }
        awaitEmpty(group);
        checkStartOffsetsWithin(group, Map.of(new TopicPartition(topic, 0), 30L, new TopicPartition(topic, 1), 30L));
        checkNothingLeft(group, topic, 2);
    }

    /**
     * (b) Explicit acknowledgement: of 12 records, RELEASE gives offsets 0, 3, 6, 9 back
     * (delivered again, delivery count 2, then accepted), REJECT archives 1, 4, 7, 10 (never
     * delivered again), the rest are accepted; the start offset ends past all of them.
     */
    private void explicitAcknowledgement() throws Exception {
        String topic = suite.topic("share-explicit");
        suite.createTopic(topic, 1);
        String group = "java-share-explicit-" + run;
        startAtEarliest(group);
        int count = 12;
        produceTo(topic, 0, count);
        Map<Long, List<Short>> deliveries = new TreeMap<>();
        try (KafkaShareConsumer<String, String> consumer = shareConsumer(group,
                Map.of("share.acknowledgement.mode", "explicit"))) {
            consumer.subscribe(List.of(topic));
            long deadline = System.currentTimeMillis() + JavaClientSuite.WAIT_MS;
            long quietUntil = Long.MAX_VALUE;
            while (System.currentTimeMillis() < Math.min(deadline, quietUntil)) {
                for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(200))) {
                    check(record.deliveryCount().isPresent(), "no delivery count on " + record.offset());
                    short delivery = record.deliveryCount().get();
                    deliveries.computeIfAbsent(record.offset(), o -> new ArrayList<>()).add(delivery);
                    AcknowledgeType type = AcknowledgeType.ACCEPT;
                    if (delivery == 1 && record.offset() % 3 == 0) {
                        type = AcknowledgeType.RELEASE;
                    } else if (delivery == 1 && record.offset() % 3 == 1) {
                        type = AcknowledgeType.REJECT;
                    }
                    consumer.acknowledge(record, type);
                }
                checkAcknowledged(consumer.commitSync(Duration.ofSeconds(30)), "commitSync");
                boolean complete = deliveries.size() == count && deliveries.entrySet().stream()
                        .allMatch(e -> e.getValue().size() == (e.getKey() % 3 == 0 ? 2 : 1));
                if (complete && quietUntil == Long.MAX_VALUE) {
                    quietUntil = System.currentTimeMillis() + QUIET.toMillis();
                }
            }
        }
        Map<Long, List<Short>> expected = new TreeMap<>();
        for (long offset = 0; offset < count; offset++) {
            expected.put(offset, offset % 3 == 0 ? List.of((short) 1, (short) 2) : List.of((short) 1));
        }
        checkEquals(expected, deliveries, "delivery counts per offset");
        awaitEmpty(group);
        checkStartOffsetsWithin(group, Map.of(new TopicPartition(topic, 0), (long) count));
        checkNothingLeft(group, topic, 1);
    }

    /**
     * A record released at every delivery is delivered group.share.delivery.count.limit
     * times (Kafka's default, 5, on both brokers here), then archived: never again, and the
     * records after it are not held up.
     */
    private void deliveryLimit() throws Exception {
        String topic = suite.topic("share-limit");
        suite.createTopic(topic, 1);
        String group = "java-share-limit-" + run;
        startAtEarliest(group);
        produceTo(topic, 0, 3);
        List<String> deliveries = new ArrayList<>();
        try (KafkaShareConsumer<String, String> consumer = shareConsumer(group,
                Map.of("share.acknowledgement.mode", "explicit"))) {
            consumer.subscribe(List.of(topic));
            long deadline = System.currentTimeMillis() + JavaClientSuite.WAIT_MS;
            long quietUntil = Long.MAX_VALUE;
            while (System.currentTimeMillis() < Math.min(deadline, quietUntil)) {
                for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(200))) {
                    deliveries.add(record.offset() + "#" + record.deliveryCount().orElse((short) -1));
                    // Offset 0 goes back at every delivery; 1 and 2 are accepted.
                    consumer.acknowledge(record, record.offset() == 0 ? AcknowledgeType.RELEASE : AcknowledgeType.ACCEPT);
                }
                checkAcknowledged(consumer.commitSync(Duration.ofSeconds(30)), "commitSync");
                if (deliveries.contains("0#5") && deliveries.contains("2#1") && quietUntil == Long.MAX_VALUE) {
                    quietUntil = System.currentTimeMillis() + QUIET.toMillis();
                }
            }
        }
        List<String> sorted = new ArrayList<>(deliveries);
        java.util.Collections.sort(sorted);
        checkEquals(List.of("0#1", "0#2", "0#3", "0#4", "0#5", "1#1", "2#1"), sorted, "deliveries (offset#count)");
        awaitEmpty(group);
        checkNothingLeft(group, topic, 1);
    }

    /**
     * (c) Two share consumers in one group on a one-partition topic: both are assigned the
     * partition, both get records, and no record goes to both.
     */
    private void twoMembersOnePartition() throws Exception {
        String topic = suite.topic("share-two");
        suite.createTopic(topic, 1);
        String group = "java-share-two-" + run;
        startAtEarliest(group);
        int count = 100;
        Map<String, List<Long>> received = new ConcurrentHashMap<>();
        Set<Long> all = ConcurrentHashMap.newKeySet();
        AtomicReference<Throwable> failure = new AtomicReference<>();
        long deadline = System.currentTimeMillis() + JavaClientSuite.WAIT_MS * 2;
        List<Thread> threads = new ArrayList<>();
        for (String name : List.of("a", "b")) {
            received.put(name, java.util.Collections.synchronizedList(new ArrayList<>()));
            Thread thread = new Thread(() -> {
                // Few records a poll and a little "processing" after each, so that one member
                // cannot take the whole partition before the other fetches.
                try (KafkaShareConsumer<String, String> consumer = shareConsumer(group, Map.of(
                        ConsumerConfig.CLIENT_ID_CONFIG, "java-share-two-" + name + "-" + run,
                        ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "5"))) {
                    consumer.subscribe(List.of(topic));
                    long quietUntil = Long.MAX_VALUE;
                    while (System.currentTimeMillis() < Math.min(deadline, quietUntil)) {
                        var records = consumer.poll(Duration.ofMillis(100));
                        for (ConsumerRecord<String, String> record : records) {
                            received.get(name).add(record.offset());
                            all.add(record.offset());
                        }
                        if (!records.isEmpty()) {
                            Thread.sleep(50);
                        }
                        if (all.size() == count && quietUntil == Long.MAX_VALUE) {
                            quietUntil = System.currentTimeMillis() + QUIET.toMillis();
                        }
                    }
                    consumer.commitSync(Duration.ofSeconds(30));
                } catch (Throwable e) {
                    failure.compareAndSet(null, e);
                }
            }, "share-member-" + name);
            thread.setDaemon(true);
            thread.start();
            threads.add(thread);
        }
        // Both members hold the partition before anything is produced.
        TopicPartition tp = new TopicPartition(topic, 0);
        while (true) {
            ShareGroupDescription description = null;
            try {
                description = describe(group);
            } catch (ExecutionException e) {
                // GroupIdNotFoundException until the first member's heartbeat made the group.
            }
            if (description != null && description.members().size() == 2 && description.members().stream()
                    .allMatch(m -> m.assignment().topicPartitions().equals(Set.of(tp)))) {
                checkEquals(GroupState.STABLE, description.groupState(), "state with two members");
                break;
            }
            check(failure.get() == null, "a member failed: " + failure.get());
            check(System.currentTimeMillis() < deadline,
                    "the two members never both held " + tp + ": " + description);
            Thread.sleep(200);
        }
        // One batch per record: a share fetch acquires whole batches.
        try (KafkaProducer<String, String> producer = suite.producer(Map.of())) {
            for (int i = 0; i < count; i++) {
                producer.send(new ProducerRecord<>(topic, 0, "k" + i, "v" + i)).get(30, TimeUnit.SECONDS);
            }
        }
        for (Thread thread : threads) {
            thread.join(Math.max(1, deadline + 10_000 - System.currentTimeMillis()));
        }
        check(failure.get() == null, "a member failed: " + Checks.describe(failure.get()));
        List<Long> a = received.get("a");
        List<Long> b = received.get("b");
        checkEquals(count, a.size() + b.size(), "records delivered (a: " + a.size() + ", b: " + b.size() + ")");
        checkEquals(count, all.size(), "distinct records");
        check(!a.isEmpty() && !b.isEmpty(), "one member got every record: a " + a.size() + ", b " + b.size());
    }

    /**
     * Produces 10 records to each of the topic's two partitions and has one share consumer
     * (client id `clientId`) read them all; `whileMember` runs while it is still a member.
     */
    private void consumeTwoPartitions(String group, String topic, String clientId, Checks.Check whileMember)
            throws Exception {
        startAtEarliest(group);
        produceTo(topic, 0, 10);
        produceTo(topic, 1, 10);
        try (KafkaShareConsumer<String, String> consumer = shareConsumer(group,
                Map.of(ConsumerConfig.CLIENT_ID_CONFIG, clientId))) {
            consumer.subscribe(List.of(topic));
            checkEachOnce(pollShare(consumer, 20), topic, 2, 10);
            checkAcknowledged(consumer.commitSync(Duration.ofSeconds(30)), "commitSync");
            whileMember.run();
        }
        awaitEmpty(group);
    }

    /**
     * (d) The Admin client on a share group: listGroups with its type and state,
     * describeShareGroups with the member and its assignment, listShareGroupOffsets after
     * consumption, deleteShareGroupOffsets and deleteShareGroups on the empty group.
     */
    private void adminShareGroups() throws Exception {
        String topic = suite.topic("share-admin");
        suite.createTopic(topic, 2);
        String group = "java-share-admin-" + run;
        String clientId = "java-share-admin-client-" + run;
        TopicPartition p0 = new TopicPartition(topic, 0);
        TopicPartition p1 = new TopicPartition(topic, 1);
        consumeTwoPartitions(group, topic, clientId, () -> {
            Collection<GroupListing> shareGroups = admin.listGroups(ListGroupsOptions.forShareGroups())
                    .all().get(30, TimeUnit.SECONDS);
            GroupListing listing = shareGroups.stream().filter(g -> g.groupId().equals(group))
                    .findFirst().orElse(null);
            check(listing != null, "listGroups(forShareGroups) lacks " + group + ": " + shareGroups);
            checkEquals(Optional.of(GroupType.SHARE), listing.type(), "listed type");
            checkEquals(Optional.of(GroupState.STABLE), listing.groupState(), "listed state");
            checkEquals("share", listing.protocol(), "listed protocol type");
            check(admin.listGroups(ListGroupsOptions.forConsumerGroups()).all().get(30, TimeUnit.SECONDS)
                    .stream().noneMatch(g -> g.groupId().equals(group)),
                    "listGroups(forConsumerGroups) lists the share group");

            ShareGroupDescription description = describe(group);
            long deadline = System.currentTimeMillis() + JavaClientSuite.WAIT_MS;
            while (description.members().size() != 1
                    || description.members().iterator().next().memberEpoch() != description.targetAssignmentEpoch()) {
                check(System.currentTimeMillis() < deadline, "member never at the target epoch: " + description);
                Thread.sleep(200);
                description = describe(group);
            }
            checkEquals(GroupState.STABLE, description.groupState(), "described state");
            check(description.coordinator() != null && description.coordinator().id() >= 0,
                    "no coordinator: " + description);
            check(description.groupEpoch() >= description.targetAssignmentEpoch()
                    && description.targetAssignmentEpoch() > 0, "epochs: " + description);
            ShareMemberDescription member = description.members().iterator().next();
            checkEquals(clientId, member.clientId(), "member's client id");
            check(member.consumerId() != null && !member.consumerId().isEmpty(), "no member id");
            check(member.host() != null && !member.host().isEmpty(), "no member host");
            checkEquals(Set.of(p0, p1), member.assignment().topicPartitions(), "member's assignment");
        });
        checkEquals(GroupState.EMPTY, describe(group).groupState(), "state once the member left");

        // The group's configs: its own share.auto.offset.reset, every other one at its
        // default (the broker's group.share.* where there is one, still DEFAULT_CONFIG).
        ConfigResource resource = new ConfigResource(ConfigResource.Type.GROUP, group);
        Config config = admin.describeConfigs(List.of(resource)).all().get(30, TimeUnit.SECONDS).get(resource);
        Map<String, String> sources = new TreeMap<>();
        config.entries().stream().filter(e -> e.name().startsWith("share."))
                .forEach(e -> sources.put(e.name(), e.value() + " " + e.source()));
        check(sources.size() >= 5, "share.* group configs: " + sources);
        sources.forEach((name, described) -> checkEquals(name.equals("share.auto.offset.reset")
                ? "earliest DYNAMIC_GROUP_CONFIG" : "DEFAULT_CONFIG",
                name.equals("share.auto.offset.reset") ? described : described.replaceAll("^\\S+ ", ""),
                "value and source of " + name));
        checkStartOffsetsWithin(group, Map.of(p0, 10L, p1, 10L));

        admin.deleteShareGroupOffsets(group, Set.of(topic)).all().get(30, TimeUnit.SECONDS);
        Map<TopicPartition, Long> afterDelete = startOffsets(group);
        check(afterDelete.values().stream().allMatch(v -> v == null),
                "start offsets left after deleteShareGroupOffsets: " + afterDelete);

        admin.deleteShareGroups(List.of(group)).all().get(30, TimeUnit.SECONDS);
        check(admin.listGroups().all().get(30, TimeUnit.SECONDS).stream()
                .noneMatch(g -> g.groupId().equals(group)), "deleted share group still listed");
    }

    /**
     * alterShareGroupOffsets: refused while the group has a member (NON_EMPTY_GROUP, which
     * Kafka 4.1's Admin client drops with the response's top-level error and reports as
     * success, so the refusal is checked by its effect: p1 is not read again from 5); on the
     * empty group p0 goes back to 3, listShareGroupOffsets says so, and a member joining again
     * reads 3..9 of p0 and nothing else.
     */
    private void adminAlterShareGroupOffsets() throws Exception {
        String topic = suite.topic("share-alter");
        suite.createTopic(topic, 2);
        String group = "java-share-alter-" + run;
        TopicPartition p0 = new TopicPartition(topic, 0);
        TopicPartition p1 = new TopicPartition(topic, 1);
        consumeTwoPartitions(group, topic, "java-share-alter-client-" + run, () -> {
            try {
                admin.alterShareGroupOffsets(group, Map.of(p1, 5L)).all().get(30, TimeUnit.SECONDS);
            } catch (ExecutionException e) {
                check(e.getCause() instanceof GroupNotEmptyException,
                        "expected GroupNotEmptyException, got " + e.getCause());
            }
        });
        var altered = admin.alterShareGroupOffsets(group, Map.of(p0, 3L));
        altered.partitionResult(p0).get(30, TimeUnit.SECONDS);
        checkEquals(3L, startOffsets(group).get(p0), "start offset of p0 after the alter");
        try (KafkaShareConsumer<String, String> consumer = shareConsumer(group, Map.of())) {
            consumer.subscribe(List.of(topic));
            checkEquals(List.of("0@3", "0@4", "0@5", "0@6", "0@7", "0@8", "0@9"),
                    pollShare(consumer, 7).stream().map(r -> r.partition() + "@" + r.offset()).sorted()
                            .collect(Collectors.toList()), "records read after the alter");
            checkAcknowledged(consumer.commitSync(Duration.ofSeconds(30)), "commitSync");
        }
        awaitEmpty(group);
        admin.deleteShareGroups(List.of(group)).all().get(30, TimeUnit.SECONDS);
    }

    /**
     * deleteShareGroupOffsets forgets what the empty group had read of a topic: a member
     * joining again starts where share.auto.offset.reset says (earliest here) and receives
     * every record again, each as a first delivery.
     */
    private void deleteOffsetsThenReread() throws Exception {
        String topic = suite.topic("share-reread");
        suite.createTopic(topic, 1);
        String group = "java-share-reread-" + run;
        startAtEarliest(group);
        produceTo(topic, 0, 10);
        try (KafkaShareConsumer<String, String> consumer = shareConsumer(group, Map.of())) {
            consumer.subscribe(List.of(topic));
            checkEachOnce(pollShare(consumer, 10), topic, 1, 10);
            checkAcknowledged(consumer.commitSync(Duration.ofSeconds(30)), "commitSync");
        }
        awaitEmpty(group);
        admin.deleteShareGroupOffsets(group, Set.of(topic)).all().get(30, TimeUnit.SECONDS);
        try (KafkaShareConsumer<String, String> consumer = shareConsumer(group, Map.of())) {
            consumer.subscribe(List.of(topic));
            checkEachOnce(pollShare(consumer, 10), topic, 1, 10);
            checkAcknowledged(consumer.commitSync(Duration.ofSeconds(30)), "commitSync");
        }
        awaitEmpty(group);
        admin.deleteShareGroups(List.of(group)).all().get(30, TimeUnit.SECONDS);
    }
}
