// What a weight sync does with the requests the engines are running (torch-free: the workers'
// interface and the driver name it; comm::WeightSender and the disk transport act on it).
#ifndef SLIME_COMM_IN_FLIGHT_H_
#define SLIME_COMM_IN_FLIGHT_H_

namespace slime::comm {

enum class InFlight {
  // Pause with mode "abort" (the requests end, finish_reason abort) and flush the prefix cache
  // before the transfer: slime's sync between rollouts, when the engines are idle anyway.
  kAbort,
  // Pause with mode "retract": the requests keep their tokens and go back to the waiting queue
  // (their K/V is freed), the engine flushes its prefix cache as the update lands, and at
  // continue each one prefills prompt + kept tokens with the new weights and decodes on; every
  // token keeps the version that sampled it (fully async training). No K/V computed with the
  // old weights outlives the update.
  kKeep,
};

}  // namespace slime::comm

#endif  // SLIME_COMM_IN_FLIGHT_H_
