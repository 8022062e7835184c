// The restricted pickle reader and the SGLang flattened-bucket decoder (see
// include/slime/comm/torch_pickle.h).
#include "slime/comm/torch_pickle.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>

#include "absl/strings/escaping.h"

namespace slime::comm {
namespace {

using Kind = PickleValue::Kind;

PickleRef Make(Kind kind) {
  auto v = std::make_shared<PickleValue>();
  v->kind = kind;
  return v;
}

PickleRef MakeInt(int64_t i) {
  PickleRef v = Make(Kind::kInt);
  v->integer = i;
  return v;
}

PickleRef MakeText(Kind kind, std::string s) {
  PickleRef v = Make(kind);
  v->text = std::move(s);
  return v;
}

// The stack machine of pickle's VM, without anything that runs code: globals stay names and
// calls stay nodes (see the header).
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}

  StatusOr<PickleRef> Run() {
    while (pos_ < in_.size()) {
      op_at_ = pos_;
      op_ = static_cast<unsigned char>(in_[pos_++]);
      if (op_ == '.') {  // STOP
        if (stack_.size() != 1 || !marks_.empty()) return Error("STOP with an unbalanced stack");
        return stack_.back();
      }
      Status s = Step();
      if (!s.ok()) return s;
    }
    return absl::InvalidArgumentError(
        fmt::format("pickle: the data ends at byte {} without a STOP opcode", in_.size()));
  }

 private:
  Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(
        fmt::format("pickle: opcode 0x{:02x} at byte {}: {}", op_, op_at_, what));
  }

  StatusOr<std::string_view> Take(uint64_t n) {
    if (n > in_.size() - pos_) return Error(fmt::format("needs {} bytes, {} are left", n, in_.size() - pos_));
    std::string_view s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  StatusOr<uint64_t> Unsigned(int n) {  // little-endian
    SLIME_ASSIGN_OR_RETURN(std::string_view s, Take(n));
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(s[i]);
    return v;
  }
  StatusOr<std::string_view> Line() {
    const size_t end = in_.find('\n', pos_);
    if (end == std::string_view::npos) return Error("a text argument without its newline");
    std::string_view s = in_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }

  StatusOr<PickleRef> Pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() == marks_.back())) {
      return Error("pops an empty stack");
    }
    PickleRef v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  StatusOr<PickleRef> Top() {
    if (stack_.empty()) return Error("needs a value on the stack");
    return stack_.back();
  }
  // The values above the topmost MARK, removing them and the mark.
  StatusOr<std::vector<PickleRef>> PopMark() {
    if (marks_.empty()) return Error("needs a MARK");
    const size_t at = marks_.back();
    marks_.pop_back();
    std::vector<PickleRef> items(std::make_move_iterator(stack_.begin() + at),
                                 std::make_move_iterator(stack_.end()));
    stack_.resize(at);
    return items;
  }
  StatusOr<PickleRef> Memo(uint64_t key) {
    auto it = memo_.find(key);
    if (it == memo_.end()) return Error(fmt::format("memo key {} was never stored", key));
    return it->second;
  }
  Status Store(uint64_t key) {
    SLIME_ASSIGN_OR_RETURN(PickleRef top, Top());
    if (memo_.size() > in_.size()) return Error("too many memo entries");
    memo_[key] = std::move(top);
    return absl::OkStatus();
  }
  void Push(PickleRef v) { stack_.push_back(std::move(v)); }

  Status PushTuple(size_t n) {
    if (stack_.size() < n || (!marks_.empty() && stack_.size() - n < marks_.back())) {
      return Error(fmt::format("needs {} values on the stack", n));
    }
    PickleRef t = Make(Kind::kTuple);
    t->items.assign(stack_.end() - n, stack_.end());
    stack_.resize(stack_.size() - n);
    Push(std::move(t));
    return absl::OkStatus();
  }
  Status Append(const std::vector<PickleRef>& values) {
    SLIME_ASSIGN_OR_RETURN(PickleRef target, Top());
    if (target->kind != Kind::kList && target->kind != Kind::kSet) {
      return Error("appends to something that is not a list or set");
    }
    target->items.insert(target->items.end(), values.begin(), values.end());
    return absl::OkStatus();
  }
  Status SetItems(const std::vector<PickleRef>& kv) {
    if (kv.size() % 2 != 0) return Error("an odd number of dict keys and values");
    SLIME_ASSIGN_OR_RETURN(PickleRef target, Top());
    if (target->kind != Kind::kDict) return Error("sets items on something that is not a dict");
    for (size_t i = 0; i < kv.size(); i += 2) target->entries.emplace_back(kv[i], kv[i + 1]);
    return absl::OkStatus();
  }
  Status PushGlobal(std::string_view module, std::string_view name) {
    if (module.empty() || name.empty()) return Error("a global with an empty module or name");
    Push(MakeText(Kind::kGlobal, fmt::format("{}.{}", module, name)));
    return absl::OkStatus();
  }
  Status PushCall(PickleRef callee, PickleRef args) {
    if (args->kind != Kind::kTuple) return Error("call arguments are not a tuple");
    PickleRef call = Make(Kind::kCall);
    call->callee = std::move(callee);
    call->items = args->items;
    Push(std::move(call));
    return absl::OkStatus();
  }
  Status PushText(Kind kind, uint64_t n) {
    SLIME_ASSIGN_OR_RETURN(std::string_view s, Take(n));
    Push(MakeText(kind, std::string(s)));
    return absl::OkStatus();
  }
  Status PushLong(uint64_t n) {  // LONG1/LONG4: little-endian two's complement
    if (n > 8) return Error(fmt::format("an integer of {} bytes does not fit 64 bits", n));
    SLIME_ASSIGN_OR_RETURN(std::string_view s, Take(n));
    uint64_t v = 0;
    for (int i = static_cast<int>(n) - 1; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(s[i]);
    if (n > 0 && n < 8 && (static_cast<unsigned char>(s[n - 1]) & 0x80)) v |= ~uint64_t{0} << (8 * n);
    Push(MakeInt(static_cast<int64_t>(v)));
    return absl::OkStatus();
  }
  StatusOr<uint64_t> DecimalKey() {
    SLIME_ASSIGN_OR_RETURN(std::string_view l, Line());
    uint64_t k = 0;
    if (l.empty() || l.size() > 18) return Error("a memo key that is not a decimal number");
    for (char c : l) {
      if (c < '0' || c > '9') return Error("a memo key that is not a decimal number");
      k = k * 10 + (c - '0');
    }
    return k;
  }
  Status PushDecimal(std::string_view line) {
    std::string s(line);
    if (!s.empty() && s.back() == 'L') s.pop_back();
    if (s == "00" || s == "01") {  // protocol 0's False and True
      PickleRef b = Make(Kind::kBool);
      b->boolean = s == "01";
      Push(std::move(b));
      return absl::OkStatus();
    }
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || errno != 0) return Error("an integer that is not decimal or exceeds 64 bits");
    Push(MakeInt(v));
    return absl::OkStatus();
  }

  Status Step();

  std::string_view in_;
  size_t pos_ = 0;
  size_t op_at_ = 0;
  unsigned char op_ = 0;
  std::vector<PickleRef> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, PickleRef> memo_;
};

Status Reader::Step() {
  switch (op_) {
    case 0x80: return Take(1).status();                            // PROTO
    case 0x95: return Take(8).status();                            // FRAME
    case '(': marks_.push_back(stack_.size()); return absl::OkStatus();  // MARK
    case 'N': Push(Make(Kind::kNone)); return absl::OkStatus();
    case 0x88: case 0x89: {                                        // NEWTRUE, NEWFALSE
      PickleRef b = Make(Kind::kBool);
      b->boolean = op_ == 0x88;
      Push(std::move(b));
      return absl::OkStatus();
    }
    case 'J': {                                                    // BININT
      SLIME_ASSIGN_OR_RETURN(uint64_t v, Unsigned(4));
      Push(MakeInt(static_cast<int32_t>(static_cast<uint32_t>(v))));
      return absl::OkStatus();
    }
    case 'K': { SLIME_ASSIGN_OR_RETURN(uint64_t v, Unsigned(1)); Push(MakeInt(v)); return absl::OkStatus(); }
    case 'M': { SLIME_ASSIGN_OR_RETURN(uint64_t v, Unsigned(2)); Push(MakeInt(v)); return absl::OkStatus(); }
    case 0x8a: { SLIME_ASSIGN_OR_RETURN(uint64_t n, Unsigned(1)); return PushLong(n); }  // LONG1
    case 0x8b: { SLIME_ASSIGN_OR_RETURN(uint64_t n, Unsigned(4)); return PushLong(n); }  // LONG4
    case 'I': case 'L': { SLIME_ASSIGN_OR_RETURN(std::string_view l, Line()); return PushDecimal(l); }
    case 'G': {                                                    // BINFLOAT (big-endian)
      SLIME_ASSIGN_OR_RETURN(std::string_view s, Take(8));
      uint64_t bits = 0;
      for (char c : s) bits = bits << 8 | static_cast<unsigned char>(c);
      PickleRef f = Make(Kind::kFloat);
      std::memcpy(&f->real, &bits, 8);
      Push(std::move(f));
      return absl::OkStatus();
    }
    case 'X': { SLIME_ASSIGN_OR_RETURN(uint64_t n, Unsigned(4)); return PushText(Kind::kString, n); }
    case 0x8c: { SLIME_ASSIGN_OR_RETURN(uint64_t n, Unsigned(1)); return PushText(Kind::kString, n); }
    case 0x8d: { SLIME_ASSIGN_OR_RETURN(uint64_t n, Unsigned(8)); return PushText(Kind::kString, n); }
    case 'B': { SLIME_ASSIGN_OR_RETURN(uint64_t n, Unsigned(4)); return PushText(Kind::kBytes, n); }
    case 'C': { SLIME_ASSIGN_OR_RETURN(uint64_t n, Unsigned(1)); return PushText(Kind::kBytes, n); }
    case 0x8e: case 0x96: { SLIME_ASSIGN_OR_RETURN(uint64_t n, Unsigned(8)); return PushText(Kind::kBytes, n); }
    case 'T': { SLIME_ASSIGN_OR_RETURN(uint64_t n, Unsigned(4)); return PushText(Kind::kBytes, n); }
    case 'U': { SLIME_ASSIGN_OR_RETURN(uint64_t n, Unsigned(1)); return PushText(Kind::kBytes, n); }
    case ']': Push(Make(Kind::kList)); return absl::OkStatus();
    case ')': Push(Make(Kind::kTuple)); return absl::OkStatus();
    case '}': Push(Make(Kind::kDict)); return absl::OkStatus();
    case 0x8f: Push(Make(Kind::kSet)); return absl::OkStatus();
    case 'a': { SLIME_ASSIGN_OR_RETURN(PickleRef v, Pop()); return Append({v}); }
    case 'e': case 0x90: { SLIME_ASSIGN_OR_RETURN(auto vs, PopMark()); return Append(vs); }
    case 's': {
      SLIME_ASSIGN_OR_RETURN(PickleRef v, Pop());
      SLIME_ASSIGN_OR_RETURN(PickleRef k, Pop());
      return SetItems({k, v});
    }
    case 'u': { SLIME_ASSIGN_OR_RETURN(auto kv, PopMark()); return SetItems(kv); }
    case 'l': case 't': case 0x91: {                               // LIST, TUPLE, FROZENSET
      SLIME_ASSIGN_OR_RETURN(auto vs, PopMark());
      PickleRef c = Make(op_ == 'l' ? Kind::kList : op_ == 't' ? Kind::kTuple : Kind::kSet);
      c->items = std::move(vs);
      Push(std::move(c));
      return absl::OkStatus();
    }
    case 'd': {
      SLIME_ASSIGN_OR_RETURN(auto kv, PopMark());
      Push(Make(Kind::kDict));
      return SetItems(kv);
    }
    case 0x85: return PushTuple(1);
    case 0x86: return PushTuple(2);
    case 0x87: return PushTuple(3);
    case 'p': {                                                    // PUT
      SLIME_ASSIGN_OR_RETURN(uint64_t k, DecimalKey());
      return Store(k);
    }
    case 'g': {                                                    // GET
      SLIME_ASSIGN_OR_RETURN(uint64_t k, DecimalKey());
      SLIME_ASSIGN_OR_RETURN(PickleRef v, Memo(k));
      Push(std::move(v));
      return absl::OkStatus();
    }
    case 'q': { SLIME_ASSIGN_OR_RETURN(uint64_t k, Unsigned(1)); return Store(k); }
    case 'r': { SLIME_ASSIGN_OR_RETURN(uint64_t k, Unsigned(4)); return Store(k); }
    case 0x94: return Store(memo_.size());                         // MEMOIZE
    case 'h': case 'j': {
      SLIME_ASSIGN_OR_RETURN(uint64_t k, Unsigned(op_ == 'h' ? 1 : 4));
      SLIME_ASSIGN_OR_RETURN(PickleRef v, Memo(k));
      Push(std::move(v));
      return absl::OkStatus();
    }
    case 'c': {                                                    // GLOBAL
      SLIME_ASSIGN_OR_RETURN(std::string_view module, Line());
      SLIME_ASSIGN_OR_RETURN(std::string_view name, Line());
      return PushGlobal(module, name);
    }
    case 0x93: {                                                   // STACK_GLOBAL
      SLIME_ASSIGN_OR_RETURN(PickleRef name, Pop());
      SLIME_ASSIGN_OR_RETURN(PickleRef module, Pop());
      if (name->kind != Kind::kString || module->kind != Kind::kString) {
        return Error("STACK_GLOBAL needs two strings");
      }
      return PushGlobal(module->text, name->text);
    }
    case 'R': case 0x81: {                                         // REDUCE, NEWOBJ
      SLIME_ASSIGN_OR_RETURN(PickleRef args, Pop());
      SLIME_ASSIGN_OR_RETURN(PickleRef callee, Pop());
      return PushCall(std::move(callee), std::move(args));
    }
    case 0x92: {                                                   // NEWOBJ_EX
      SLIME_ASSIGN_OR_RETURN(PickleRef kwargs, Pop());
      SLIME_ASSIGN_OR_RETURN(PickleRef args, Pop());
      SLIME_ASSIGN_OR_RETURN(PickleRef cls, Pop());
      if (kwargs->kind != Kind::kDict || !kwargs->entries.empty()) {
        return Error("NEWOBJ_EX with keyword arguments is not supported");
      }
      return PushCall(std::move(cls), std::move(args));
    }
    case 'b': {                                                    // BUILD
      SLIME_ASSIGN_OR_RETURN(PickleRef state, Pop());
      SLIME_ASSIGN_OR_RETURN(PickleRef target, Top());
      if (target->kind != Kind::kCall) return Error("BUILD on something that is not an object");
      target->state = std::move(state);
      return absl::OkStatus();
    }
    case '0': return Pop().status();                               // POP
    case '1': return PopMark().status();                           // POP_MARK
    case '2': { SLIME_ASSIGN_OR_RETURN(PickleRef v, Top()); Push(std::move(v)); return absl::OkStatus(); }
    default:
      return Error(
          "not supported here (persistent ids, extension codes, out-of-band buffers, INST/OBJ "
          "and the text string opcodes are refused)");
  }
}

void Summarize(const PickleValue& v, std::string& out, int depth) {
  if (out.size() > 200) return;
  if (depth > 4) { out += "..."; return; }
  auto list = [&](const std::vector<PickleRef>& items, const char* open, const char* close) {
    out += open;
    for (size_t i = 0; i < items.size() && out.size() <= 200; ++i) {
      if (i) out += ", ";
      Summarize(*items[i], out, depth + 1);
    }
    out += close;
  };
  switch (v.kind) {
    case Kind::kNone: out += "None"; break;
    case Kind::kBool: out += v.boolean ? "True" : "False"; break;
    case Kind::kInt: out += std::to_string(v.integer); break;
    case Kind::kFloat: out += fmt::format("{}", v.real); break;
    case Kind::kString: out += "'" + v.text.substr(0, 60) + "'"; break;
    case Kind::kBytes: out += fmt::format("<{} bytes>", v.text.size()); break;
    case Kind::kList: list(v.items, "[", "]"); break;
    case Kind::kTuple: list(v.items, "(", ")"); break;
    case Kind::kSet: list(v.items, "{", "}"); break;
    case Kind::kGlobal: out += v.text; break;
    case Kind::kDict:
      out += "{";
      for (size_t i = 0; i < v.entries.size() && out.size() <= 200; ++i) {
        if (i) out += ", ";
        Summarize(*v.entries[i].first, out, depth + 1);
        out += ": ";
        Summarize(*v.entries[i].second, out, depth + 1);
      }
      out += "}";
      break;
    case Kind::kCall:
      Summarize(*v.callee, out, depth + 1);
      list(v.items, "(", ")");
      break;
  }
}

// ---- the bucket

// The last component of a global's dotted name ("torch.multiprocessing.reductions.rebuild_tensor"
// -> "rebuild_tensor"); empty when `v` is not a global.
std::string GlobalName(const PickleValue& v) {
  if (v.kind != Kind::kGlobal) return "";
  const size_t dot = v.text.rfind('.');
  return v.text.substr(dot + 1);
}
std::string GlobalModule(const PickleValue& v) {
  const size_t dot = v.text.rfind('.');
  return dot == std::string::npos ? "" : v.text.substr(0, dot);
}
bool IsCallOf(const PickleValue& v, std::initializer_list<std::string_view> names) {
  if (v.kind != Kind::kCall || !v.callee) return false;
  const std::string name = GlobalName(*v.callee);
  for (std::string_view n : names) if (name == n) return true;
  return false;
}

Status Bad(std::string_view where, std::string_view what, const PickleValue& v) {
  std::string s;
  Summarize(v, s, 0);
  return absl::InvalidArgumentError(fmt::format("{}: {} (got {})", where, what, s));
}

StatusOr<int64_t> Int(const PickleValue& v, std::string_view where) {
  if (v.kind != Kind::kInt) return Bad(where, "expected an integer", v);
  return v.integer;
}

// torch.float32 (a global of module torch) -> "float32".
StatusOr<std::string> Dtype(const PickleValue& v, std::string_view where) {
  if (v.kind != Kind::kGlobal || GlobalModule(v) != "torch" || DtypeBytes(GlobalName(v)) == 0) {
    return Bad(where, "expected a torch dtype such as torch.bfloat16", v);
  }
  return GlobalName(v);
}

// torch.Size((a, b)) or a plain tuple/list of ints.
StatusOr<std::vector<int64_t>> Shape(const PickleValue& v, std::string_view where) {
  const PickleValue* dims = &v;
  if (v.kind == Kind::kCall) {
    if (!v.callee || v.callee->text != "torch.Size" || v.items.size() != 1) {
      return Bad(where, "expected torch.Size(...)", v);
    }
    dims = v.items[0].get();
  }
  if (dims->kind != Kind::kTuple && dims->kind != Kind::kList) {
    return Bad(where, "expected a shape", v);
  }
  std::vector<int64_t> out;
  for (const PickleRef& d : dims->items) {
    if (d->kind != Kind::kInt || d->integer < 0) return Bad(where, "a dimension is not a non-negative integer", v);
    out.push_back(d->integer);
  }
  return out;
}

// The flattened tensor must be one contiguous run of elements (1-D, stride 1).
Status CheckFlat(const std::vector<int64_t>& size, const std::vector<int64_t>& stride,
                 std::string_view where) {
  if (size.size() != 1 || (stride.size() != 1) || (size[0] > 1 && stride[0] != 1)) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: the flattened tensor must be 1-D and contiguous (size {}, stride {})", where,
        fmt::join(size, ","), fmt::join(stride, ",")));
  }
  return absl::OkStatus();
}

const std::map<std::string, std::string, std::less<>>& LegacyStorageDtypes() {
  static const auto* m = new std::map<std::string, std::string, std::less<>>{
      {"ByteStorage", "uint8"},   {"CharStorage", "int8"},      {"ShortStorage", "int16"},
      {"IntStorage", "int32"},    {"LongStorage", "int64"},     {"HalfStorage", "float16"},
      {"FloatStorage", "float32"}, {"DoubleStorage", "float64"}, {"BFloat16Storage", "bfloat16"},
      {"BoolStorage", "bool"}};
  return *m;
}

// The cudaIpcMemHandle_t of a storage handle: torch 1.x sends the 64 bytes; torch 2.x its
// caching allocator's form, [version byte][type byte][payload], where type 'c' (a cudaMalloc
// block) is followed by the 64 bytes and 'e' (an expandable segment) by handles that only a
// torch consumer can import.
StatusOr<std::string> CudaMemHandle(const PickleValue& v) {
  constexpr std::string_view w = "flattened_tensor CUDA IPC handle";
  if (v.kind != Kind::kBytes) return Bad(w, "expected bytes", v);
  const std::string& h = v.text;
  if (h.size() == 64) return h;
  if (h.size() >= 2 && h[1] == 'e') {
    return absl::InvalidArgumentError(fmt::format(
        "{}: the tensor lives in an expandable segment of torch's allocator, which only torch "
        "can import; start the sender with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False",
        w));
  }
  if (h.size() == 66 && h[1] == 'c' && h[0] >= 1 && h[0] <= 3) return h.substr(2);
  return Bad(w, "expected 64 bytes, or torch 2.x's [version]['c'][64 bytes]", v);
}

// rebuild_cuda_tensor(tensor_cls, size, stride, offset, storage_cls, dtype, device, handle,
// storage_bytes, storage_offset_bytes, requires_grad, ref_counter_handle, ref_counter_offset,
// event_handle, event_sync_required)
Status DecodeCuda(const PickleValue& call, SglangBucket& b) {
  constexpr std::string_view w = "flattened_tensor (rebuild_cuda_tensor)";
  const auto& a = call.items;
  if (a.size() != 15) {
    return Bad(w, fmt::format("expected 15 arguments, got {}", a.size()), call);
  }
  SLIME_ASSIGN_OR_RETURN(std::vector<int64_t> size, Shape(*a[1], "flattened_tensor size"));
  SLIME_ASSIGN_OR_RETURN(std::vector<int64_t> stride, Shape(*a[2], "flattened_tensor stride"));
  SLIME_RETURN_IF_ERROR(CheckFlat(size, stride, w));
  SLIME_ASSIGN_OR_RETURN(b.storage_offset, Int(*a[3], "flattened_tensor offset"));
  SLIME_ASSIGN_OR_RETURN(b.dtype, Dtype(*a[5], "flattened_tensor dtype"));
  b.numel = size[0];
  // An empty CUDA tensor (a rank with nothing to send) has no block: torch sends no handle.
  if (a[7]->kind == Kind::kNone) {
    if (b.numel != 0) return Bad(w, "no CUDA IPC handle for a non-empty tensor", call);
    b.where = SglangBucket::Where::kEmpty;
    return absl::OkStatus();
  }
  SglangCudaStorage& c = b.cuda;
  if (a[6]->kind == Kind::kString) {
    c.device_uuid = a[6]->text;
  } else {
    SLIME_ASSIGN_OR_RETURN(c.device_index, Int(*a[6], "flattened_tensor device"));
  }
  SLIME_ASSIGN_OR_RETURN(c.mem_handle, CudaMemHandle(*a[7]));
  SLIME_ASSIGN_OR_RETURN(c.storage_bytes, Int(*a[8], "flattened_tensor storage size"));
  SLIME_ASSIGN_OR_RETURN(c.storage_offset_bytes, Int(*a[9], "flattened_tensor storage offset"));
  if (a[11]->kind != Kind::kBytes && a[11]->kind != Kind::kString) {
    return Bad("flattened_tensor ref counter", "expected the shared-memory name (bytes)", *a[11]);
  }
  c.ref_counter_file = a[11]->text;
  SLIME_ASSIGN_OR_RETURN(c.ref_counter_offset, Int(*a[12], "flattened_tensor ref counter offset"));
  if (a[14]->kind != Kind::kBool) return Bad("flattened_tensor event_sync_required", "expected a bool", *a[14]);
  c.event_sync_required = a[14]->boolean;
  if (c.event_sync_required) {
    if (a[13]->kind != Kind::kBytes || a[13]->text.size() != 64) {
      return Bad("flattened_tensor CUDA IPC event handle", "expected 64 bytes", *a[13]);
    }
    c.event_handle = a[13]->text;
  }
  const int64_t elem = DtypeBytes(b.dtype);
  if (c.storage_bytes < 0 || c.storage_offset_bytes < 0 || b.storage_offset < 0 ||
      c.ref_counter_offset < 0 ||
      (b.storage_offset + b.numel) * elem > c.storage_bytes) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: {} elements of {} at element offset {} do not fit the {}-byte storage", w, b.numel,
        b.dtype, b.storage_offset, c.storage_bytes));
  }
  b.where = SglangBucket::Where::kCuda;
  return absl::OkStatus();
}

// rebuild_tensor(tensor_cls, storage, (storage_offset, size, stride, requires_grad)) over a
// shared-memory storage; `storage` is rebuild_typed_storage(untyped, dtype),
// rebuild_typed_storage_child(untyped, torch.XStorage) or a typed rebuild_storage_filename.
Status DecodeCpu(const PickleValue& call, SglangBucket& b) {
  constexpr std::string_view w = "flattened_tensor (rebuild_tensor)";
  if (call.items.size() != 3) return Bad(w, "expected 3 arguments", call);
  const PickleValue& meta = *call.items[2];
  if (meta.kind != Kind::kTuple || meta.items.size() < 3) {
    return Bad(w, "expected (storage_offset, size, stride, requires_grad)", meta);
  }
  SLIME_ASSIGN_OR_RETURN(b.storage_offset, Int(*meta.items[0], "flattened_tensor offset"));
  SLIME_ASSIGN_OR_RETURN(std::vector<int64_t> size, Shape(*meta.items[1], "flattened_tensor size"));
  SLIME_ASSIGN_OR_RETURN(std::vector<int64_t> stride, Shape(*meta.items[2], "flattened_tensor stride"));
  SLIME_RETURN_IF_ERROR(CheckFlat(size, stride, w));
  b.numel = size[0];

  const PickleValue* storage = call.items[1].get();
  if (IsCallOf(*storage, {"rebuild_typed_storage"}) && storage->items.size() == 2) {
    SLIME_ASSIGN_OR_RETURN(b.dtype, Dtype(*storage->items[1], "flattened_tensor storage dtype"));
    storage = storage->items[0].get();
  } else if (IsCallOf(*storage, {"rebuild_typed_storage_child"}) && storage->items.size() == 2) {
    auto it = LegacyStorageDtypes().find(GlobalName(*storage->items[1]));
    if (it == LegacyStorageDtypes().end()) {
      return Bad("flattened_tensor storage", "an unknown storage class", *storage->items[1]);
    }
    b.dtype = it->second;
    storage = storage->items[0].get();
  }
  if (IsCallOf(*storage, {"rebuild_storage_empty"})) {
    if (b.dtype.empty() && !storage->items.empty()) {
      auto it = LegacyStorageDtypes().find(GlobalName(*storage->items[0]));
      if (it != LegacyStorageDtypes().end()) b.dtype = it->second;
    }
    if (b.dtype.empty()) b.dtype = "uint8";
    if (b.numel != 0) return Bad(w, "an empty storage under a non-empty tensor", call);
    b.where = SglangBucket::Where::kEmpty;
    return absl::OkStatus();
  }
  if (IsCallOf(*storage, {"rebuild_storage_fd"})) {
    return absl::InvalidArgumentError(
        "flattened_tensor: a CPU tensor shared by file descriptor (torch's default "
        "\"file_descriptor\" strategy) cannot be received over HTTP; call "
        "torch.multiprocessing.set_sharing_strategy(\"file_system\") in the sender");
  }
  if (!IsCallOf(*storage, {"rebuild_storage_filename"})) {
    return Bad("flattened_tensor storage", "expected a CUDA tensor or a CPU tensor in shared memory", *storage);
  }
  // rebuild_storage_filename(cls, manager_handle, storage_handle, size [, dtype])
  const auto& a = storage->items;
  if (a.size() != 4 && a.size() != 5) return Bad("flattened_tensor storage", "expected 4 or 5 arguments", *storage);
  if (a[2]->kind != Kind::kBytes && a[2]->kind != Kind::kString) {
    return Bad("flattened_tensor storage", "expected the shared-memory name", *a[2]);
  }
  b.shm.shm_name = a[2]->text;
  SLIME_ASSIGN_OR_RETURN(int64_t n, Int(*a[3], "flattened_tensor storage size"));
  if (a.size() == 5) {
    SLIME_ASSIGN_OR_RETURN(b.dtype, Dtype(*a[4], "flattened_tensor storage dtype"));
  }
  if (b.dtype.empty()) {  // 1.13 legacy storages: the class names the dtype
    auto it = LegacyStorageDtypes().find(GlobalName(*a[0]));
    b.dtype = it == LegacyStorageDtypes().end() ? "uint8" : it->second;
  }
  // An untyped storage counts bytes; a typed one (size + dtype in the call) counts elements.
  b.shm.bytes = a.size() == 5 ? n * DtypeBytes(b.dtype) : n;
  if (b.shm.shm_name.empty() || b.shm.shm_name.find('\0') != std::string::npos ||
      b.shm.shm_name.find('/', 1) != std::string::npos) {
    return absl::InvalidArgumentError(fmt::format(
        "flattened_tensor storage: '{}' is not a shared-memory name", b.shm.shm_name));
  }
  if (n < 0 || b.storage_offset < 0 ||
      (b.storage_offset + b.numel) * DtypeBytes(b.dtype) > b.shm.bytes) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: {} elements of {} at offset {} do not fit the {}-byte storage", w, b.numel, b.dtype,
        b.storage_offset, b.shm.bytes));
  }
  b.where = b.numel == 0 ? SglangBucket::Where::kEmpty : SglangBucket::Where::kSharedMemory;
  return absl::OkStatus();
}

// FlattenedTensorMetadata: a NEWOBJ (protocol 2+) or copyreg._reconstructor call whose BUILD
// state is {name, shape, dtype, start_idx, end_idx, numel} (a dataclass's __dict__).
Status DecodeMeta(const PickleValue& v, size_t i, const SglangBucket& b, SglangTensorMeta& m) {
  const std::string w = fmt::format("metadata[{}]", i);
  if (v.kind != Kind::kCall || !v.state || v.state->kind != Kind::kDict) {
    return Bad(w, "expected a FlattenedTensorMetadata object", v);
  }
  const std::string cls = v.callee->kind == Kind::kGlobal ? GlobalName(*v.callee)
                          : !v.items.empty() ? GlobalName(*v.items[0])
                                             : "";
  if (cls != "FlattenedTensorMetadata" && cls != "__newobj__" && cls != "_reconstructor") {
    return Bad(w, "expected a FlattenedTensorMetadata object", v);
  }
  std::map<std::string, const PickleValue*, std::less<>> fields;
  for (const auto& [k, val] : v.state->entries) {
    if (k->kind == Kind::kString) fields[k->text] = val.get();
  }
  for (const char* f : {"name", "shape", "dtype", "start_idx", "end_idx", "numel"}) {
    if (!fields.count(f)) return Bad(w, fmt::format("has no field {}", f), v);
  }
  if (fields["name"]->kind != Kind::kString) return Bad(w + ".name", "expected a string", *fields["name"]);
  m.name = fields["name"]->text;
  SLIME_ASSIGN_OR_RETURN(m.shape, Shape(*fields["shape"], w + ".shape"));
  SLIME_ASSIGN_OR_RETURN(m.dtype, Dtype(*fields["dtype"], w + ".dtype"));
  SLIME_ASSIGN_OR_RETURN(m.start, Int(*fields["start_idx"], w + ".start_idx"));
  SLIME_ASSIGN_OR_RETURN(m.end, Int(*fields["end_idx"], w + ".end_idx"));
  SLIME_ASSIGN_OR_RETURN(int64_t numel, Int(*fields["numel"], w + ".numel"));
  int64_t elements = 1;
  for (int64_t d : m.shape) {
    if (d != 0 && elements > (int64_t{1} << 50) / d) return Bad(w + ".shape", "is too large", *fields["shape"]);
    elements *= d;
  }
  // In the uint8 form the run holds the tensor's bytes; otherwise its elements.
  const int64_t want = b.dtype == "uint8" && m.dtype != "uint8" ? elements * DtypeBytes(m.dtype)
                                                                : elements;
  if (m.start < 0 || m.end < m.start || m.end > b.numel || m.end - m.start != numel ||
      numel != want) {
    return absl::InvalidArgumentError(fmt::format(
        "{} ('{}'): [start_idx {}, end_idx {}) with numel {} does not hold a {} tensor of shape "
        "[{}] ({} elements of the {} flattened tensor, which has {})",
        w, m.name, m.start, m.end, numel, m.dtype, fmt::join(m.shape, ","), want, b.dtype,
        b.numel));
  }
  return absl::OkStatus();
}

const PickleValue* Field(const PickleValue& dict, std::string_view key) {
  for (const auto& [k, v] : dict.entries) {
    if (k->kind == Kind::kString && k->text == key) return v.get();
  }
  return nullptr;
}

}  // namespace

int64_t DtypeBytes(std::string_view dtype) {
  static const auto* m = new std::map<std::string, int64_t, std::less<>>{
      {"float64", 8}, {"float32", 4}, {"float16", 2}, {"bfloat16", 2}, {"int64", 8},
      {"int32", 4},   {"int16", 2},   {"int8", 1},    {"uint8", 1},    {"bool", 1},
      {"float", 4},   {"double", 8},  {"half", 2},    {"long", 8},     {"int", 4}};
  auto it = m->find(dtype);
  return it == m->end() ? 0 : it->second;
}

StatusOr<PickleRef> ParsePickle(std::string_view bytes) { return Reader(bytes).Run(); }

std::string PickleSummary(const PickleValue& v) {
  std::string out;
  Summarize(v, out, 0);
  return out;
}

StatusOr<SglangBucket> DecodeSglangBucket(std::string_view entry) {
  std::string raw;
  if (!entry.empty() && static_cast<unsigned char>(entry[0]) == 0x80) {
    raw = std::string(entry);
  } else if (!absl::Base64Unescape(absl::string_view(entry.data(), entry.size()), &raw)) {
    return absl::InvalidArgumentError("the entry is not base64 (of a pickle)");
  }
  SLIME_ASSIGN_OR_RETURN(PickleRef root, ParsePickle(raw));
  if (root->kind != Kind::kDict) {
    return Bad("the bucket", "expected a dict {\"flattened_tensor\", \"metadata\"}", *root);
  }
  const PickleValue* tensor = Field(*root, "flattened_tensor");
  const PickleValue* metadata = Field(*root, "metadata");
  if (tensor == nullptr || metadata == nullptr) {
    return Bad("the bucket", "needs the keys flattened_tensor and metadata", *root);
  }
  SglangBucket b;
  if (IsCallOf(*tensor, {"rebuild_cuda_tensor", "_rebuild_cuda_tensor_modified"})) {
    SLIME_RETURN_IF_ERROR(DecodeCuda(*tensor, b));
  } else if (IsCallOf(*tensor, {"rebuild_tensor"})) {
    SLIME_RETURN_IF_ERROR(DecodeCpu(*tensor, b));
  } else {
    return Bad("flattened_tensor", "expected a tensor pickled by torch.multiprocessing", *tensor);
  }
  if (metadata->kind != Kind::kList && metadata->kind != Kind::kTuple) {
    return Bad("metadata", "expected a list", *metadata);
  }
  for (size_t i = 0; i < metadata->items.size(); ++i) {
    SglangTensorMeta m;
    SLIME_RETURN_IF_ERROR(DecodeMeta(*metadata->items[i], i, b, m));
    b.tensors.push_back(std::move(m));
  }
  if (b.tensors.empty() && b.numel != 0) {
    return absl::InvalidArgumentError("metadata is empty but the flattened tensor is not");
  }
  return b;
}

}  // namespace slime::comm
