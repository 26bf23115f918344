// raw-produce writes one record to Kafka exactly as given, header names included: franz-go,
// like librdkafka, puts any bytes in a header name, which rdkafka's safe API cannot. The
// tests use it for hostile headers (a name that is not UTF-8).
//
//	raw-produce -brokers HOST:PORT -topic T -partition N -key HEX -value HEX -header NAMEHEX=VALUEHEX ...
package main

import (
	"context"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

type headers []kgo.RecordHeader

func (h *headers) String() string { return fmt.Sprint(*h) }

func (h *headers) Set(s string) error {
	name, value, ok := strings.Cut(s, "=")
	if !ok {
		return fmt.Errorf("a header is NAMEHEX=VALUEHEX, got %q", s)
	}
	n, err := hex.DecodeString(name)
	if err != nil {
		return fmt.Errorf("header name: %w", err)
	}
	v, err := hex.DecodeString(value)
	if err != nil {
		return fmt.Errorf("header value: %w", err)
	}
	*h = append(*h, kgo.RecordHeader{Key: string(n), Value: v})
	return nil
}

func main() {
	brokers := flag.String("brokers", "127.0.0.1:9092", "bootstrap servers")
	topic := flag.String("topic", "", "topic")
	partition := flag.Int("partition", 0, "partition")
	key := flag.String("key", "", "key, hex")
	value := flag.String("value", "", "value, hex")
	var hs headers
	flag.Var(&hs, "header", "NAMEHEX=VALUEHEX (repeatable)")
	flag.Parse()
	k, err := hex.DecodeString(*key)
	fail(err)
	v, err := hex.DecodeString(*value)
	fail(err)
	client, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(*brokers, ",")...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	fail(err)
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	record := &kgo.Record{Topic: *topic, Partition: int32(*partition), Key: k, Value: v, Headers: hs}
	fail(client.ProduceSync(ctx, record).FirstErr())
}

func fail(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "raw-produce:", err)
		os.Exit(1)
	}
}
