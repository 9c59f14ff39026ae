// Command-line oracle for jedis's ShardedJedis placement (redis.clients.jedis.util.Sharded,
// jedis 2.10 and later), for tests that compare the `jedis` / `jedis-murmur` rings of `shard`.
// No jedis jar can be fetched here, so this reproduces Sharded with the JDK's own pieces:
// java.security.MessageDigest MD5 (Hashing.MD5), MurmurHash64A (Hashing.MURMUR_HASH, seed
// 0x1234ABCD), java.util.TreeMap, java.util.regex.
//
// Usage:  javac -d DIR tests/oracles/JedisOracle.java
//         java -cp DIR JedisOracle [md5|murmur] [tag|notag]  < input  > output
//   md5 (default) = Hashing.MD5, murmur = Hashing.MURMUR_HASH;
//   tag (default) = Sharded.DEFAULT_KEY_TAG_PATTERN \{(.+?)\}, notag = no key tag pattern.
// Input (UTF-8/ASCII text):
//   line 1: space-separated "name:weight" pairs, in shard order (the last ':' splits);
//   then one key per line, hex-encoded (any bytes travel safely; an empty line is the empty key).
// Output: one shard name per key line, in order.
//
// Shards: points hash(name + "*" + n) for n in 0 .. 160*weight-1 put into a TreeMap (a later
// shard overwrites an equal point); owner = tailMap(hash(key)).firstKey(), else firstKey().
//
// Keys: real jedis applies the tag pattern to a String key and hashes SafeEncoder.encode(tag),
// the tag's UTF-8 bytes. Here a key's bytes are decoded as UTF-8 when they are valid UTF-8 (the
// String jedis would hold; re-encoding gives the same bytes back), otherwise as ISO-8859-1 (one
// char per byte, so the bytes map 1:1 and re-encode unchanged). The pattern runs on that String
// and group(1) is re-encoded with the same charset and hashed. So for every valid UTF-8 key
// (ASCII included) this is exactly real jedis; for other bytes it is the byte-for-byte reading
// the `shard` module documents (java's '.' stops at \n, \r, U+0085, U+2028, U+2029, so it
// matters which way a key is decoded). jedis's byte[] methods apply no tag rule at all: use
// "notag" to compare with those.
import java.io.BufferedReader;
import java.io.BufferedWriter;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.Charset;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.List;
import java.util.SortedMap;
import java.util.TreeMap;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

public class JedisOracle {
  static final Pattern KEY_TAG = Pattern.compile("\\{(.+?)\\}");
  static MessageDigest md5;
  static boolean murmur = false;

  static long md5Hash(byte[] key) {
    md5.reset();
    md5.update(key);
    byte[] b = md5.digest();
    return ((long) (b[3] & 0xFF) << 24) | ((long) (b[2] & 0xFF) << 16)
        | ((long) (b[1] & 0xFF) << 8) | (long) (b[0] & 0xFF);
  }

  // MurmurHash64A as jedis's MurmurHash.hash64A(ByteBuffer, int) computes it.
  static long murmurHash(byte[] data, int seed) {
    ByteBuffer buf = ByteBuffer.wrap(data).order(ByteOrder.LITTLE_ENDIAN);
    long m = 0xc6a4a7935bd1e995L;
    int r = 47;
    long h = seed ^ (buf.remaining() * m);
    long k;
    while (buf.remaining() >= 8) {
      k = buf.getLong();
      k *= m;
      k ^= k >>> r;
      k *= m;
      h ^= k;
      h *= m;
    }
    if (buf.remaining() > 0) {
      ByteBuffer finish = ByteBuffer.allocate(8).order(ByteOrder.LITTLE_ENDIAN);
      finish.put(buf).rewind();
      h ^= finish.getLong();
      h *= m;
    }
    h ^= h >>> r;
    h *= m;
    h ^= h >>> r;
    return h;
  }

  static long hash(byte[] b) {
    return murmur ? murmurHash(b, 0x1234ABCD) : md5Hash(b);
  }

  static byte[] unhex(String s) {
    if (s.length() % 2 != 0) throw new IllegalArgumentException("odd hex length: " + s);
    byte[] b = new byte[s.length() / 2];
    for (int i = 0; i < b.length; i++) {
      b[i] = (byte) Integer.parseInt(s.substring(2 * i, 2 * i + 2), 16);
    }
    return b;
  }

  static Charset charsetOf(byte[] b) {
    try {
      StandardCharsets.UTF_8.newDecoder()
          .onMalformedInput(CodingErrorAction.REPORT)
          .onUnmappableCharacter(CodingErrorAction.REPORT)
          .decode(ByteBuffer.wrap(b));
      return StandardCharsets.UTF_8;
    } catch (CharacterCodingException e) {
      return StandardCharsets.ISO_8859_1;
    }
  }

  public static void main(String[] args) throws Exception {
    boolean tag = true;
    for (String a : args) {
      if (a.equals("md5")) murmur = false;
      else if (a.equals("murmur")) murmur = true;
      else if (a.equals("tag")) tag = true;
      else if (a.equals("notag")) tag = false;
      else throw new IllegalArgumentException("unknown argument: " + a);
    }
    md5 = MessageDigest.getInstance("MD5");
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    BufferedWriter out = new BufferedWriter(new OutputStreamWriter(System.out, StandardCharsets.UTF_8));
    String first = in.readLine();
    if (first == null) throw new IllegalArgumentException("missing the name:weight line");
    TreeMap<Long, String> nodes = new TreeMap<>();
    for (String pair : first.trim().split(" +")) {
      int colon = pair.lastIndexOf(':');
      if (colon <= 0) throw new IllegalArgumentException("expected name:weight, got " + pair);
      String name = pair.substring(0, colon);
      int weight = Integer.parseInt(pair.substring(colon + 1));
      for (int n = 0; n < 160 * weight; n++) {
        nodes.put(hash((name + "*" + n).getBytes(StandardCharsets.UTF_8)), name);
      }
    }
    String line;
    while ((line = in.readLine()) != null) {
      byte[] key = unhex(line.trim());
      byte[] hashed = key;
      if (tag) {
        Charset cs = charsetOf(key);
        Matcher m = KEY_TAG.matcher(new String(key, cs));
        if (m.find()) hashed = m.group(1).getBytes(cs);
      }
      SortedMap<Long, String> tail = nodes.tailMap(hash(hashed));
      out.write(tail.isEmpty() ? nodes.get(nodes.firstKey()) : tail.get(tail.firstKey()));
      out.write('\n');
    }
    out.flush();
  }
}
